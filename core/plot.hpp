// Line plots (optionally with error bars) and bar charts as PNG, drawn by gnuplot (Debian's
// gnuplot-nox): the book's Animator figures and the model-parallel section's timing bars.
// The data and the script are written next to the PNG's name in a temporary file, gnuplot draws,
// and the PNG replaces any old one only when drawing succeeded.
#pragma once
#include <string>
#include <vector>

namespace d2l {

struct Series {
  std::string name;
  std::vector<double> x, y;
  std::vector<double> yerr;  // optional: +- yerr[k] drawn as an error bar at each point
};

struct PlotSpec {
  std::string title, xlabel, ylabel;
  std::vector<Series> series;
  bool logx = false;
  std::string key = "bottom right";  // where gnuplot puts the legend ("top left", "outside right", ...)
  double ymin = 0, ymax = 0;  // both 0: automatic
};

// Draws the PNG; returns "" on success, or one line saying why not (e.g. gnuplot missing).
std::string plot_png(const PlotSpec& spec, const std::string& png_path);

// Bars with error bars, one per label, as matplotlib's ax.bar(x, means, yerr=stds, capsize=10) with
// the labels under the bars (the model-parallel section's timing comparisons).
struct BarSpec {
  std::string title, ylabel;
  std::vector<std::string> labels;
  std::vector<double> means;
  std::vector<double> errors;  // +- errors[i] on bar i (e.g. one standard deviation); empty: none
};
// Same contract as plot_png. labels, means (and errors, when given) must have one entry per bar.
std::string bar_png(const BarSpec& spec, const std::string& png_path);

}  // namespace d2l
