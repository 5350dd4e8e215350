// Line plots (optionally with error bars), bar charts and stacked bar charts as PNG, drawn by gnuplot
// (Debian's gnuplot-nox): the book's Animator figures, the model-parallel section's timing bars and
// chapter 5's picture of what a device holds.
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
  std::vector<double> xtics{};  // when given, exactly these ticks on x, labelled as written (1, 2, 4 devices)
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

// Stacked bars, one per label, each made of the layers' segments from the bottom up (the ZeRO
// paper's Figure 1: a device's parameters, gradients and optimizer state per stage), with a legend.
struct StackedBarSpec {
  std::string title, ylabel;
  std::vector<std::string> labels;           // one per bar, written under it
  std::vector<std::string> layers;           // one per segment, bottom first: the legend
  std::vector<std::vector<double>> values;   // values[layer][bar], finite and >= 0
};
// Same contract as plot_png; a spec whose sizes disagree, or with a value negative or not finite,
// draws nothing and says so.
std::string stacked_bar_png(const StackedBarSpec& spec, const std::string& png_path);

}  // namespace d2l
