// Line plots as PNG, drawn by gnuplot (Debian's gnuplot-nox): the book's Animator figures.
// The data and the script are written next to the PNG's name in a temporary file, gnuplot draws,
// and the PNG replaces any old one only when drawing succeeded.
#pragma once
#include <string>
#include <vector>

namespace d2l {

struct Series {
  std::string name;
  std::vector<double> x, y;
};

struct PlotSpec {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool logx = false;
  double ymin = 0, ymax = 0;  // both 0: automatic
};

// Draws the PNG; returns "" on success, or one line saying why not (e.g. gnuplot missing).
std::string plot_png(const PlotSpec& spec, const std::string& png_path);

}  // namespace d2l
