// PNGs drawn by gnuplot (core/plot.hpp): line plots with whole-number ticks and stacked bars are
// written; a spec that cannot be drawn says why in one line and leaves an earlier PNG as it was.
#include <doctest/doctest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "core/plot.hpp"

using namespace d2l;
namespace fs = std::filesystem;

namespace {

std::string make_tmpdir() {
  std::string pattern = (fs::temp_directory_path() / "d2l_plot_XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

std::string read_all(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

bool have_gnuplot() { return std::system("command -v gnuplot >/dev/null 2>&1") == 0; }

// Without gnuplot every drawing answers why and writes nothing; with it, a PNG is there.
void check_drawn(const std::string& why, const std::string& png) {
  if (!have_gnuplot()) {
    CHECK(why.find("gnuplot not found") != std::string::npos);
    CHECK_FALSE(fs::exists(png));
    return;
  }
  CHECK(why == "");
  const std::string bytes = read_all(png);
  REQUIRE(bytes.size() > 8);
  CHECK(bytes.compare(0, 8, "\x89PNG\r\n\x1a\n") == 0);
}

// Chapter 5's Figure 1: four stages, three layers.
StackedBarSpec held() {
  StackedBarSpec s{"What a device holds", "MB", {"replicated", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)"},
                   {"parameters", ".grad", "optimizer state"}, {}};
  s.values = {{4, 4, 4, 1}, {4, 4, 0, 0}, {8, 2, 2, 2}};
  return s;
}

}  // namespace

TEST_CASE("a line plot with whole-number ticks on x is drawn") {
  const std::string dir = make_tmpdir(), png = dir + "/lines.png";
  PlotSpec spec{"peak per device", "devices N", "MB", {{"ZeRO-3", {1, 2, 4}, {16, 9, 5}, {}}}};
  spec.xtics = {1, 2, 4};
  check_drawn(plot_png(spec, png), png);
  fs::remove_all(dir);
}

TEST_CASE("a stacked bar chart is drawn, and replaces an earlier PNG") {
  const std::string dir = make_tmpdir(), png = dir + "/held.png";
  if (have_gnuplot()) std::ofstream(png) << "an earlier plot";
  check_drawn(stacked_bar_png(held(), png), png);
  fs::remove_all(dir);
}

TEST_CASE("a stacked bar spec that cannot be drawn says why and leaves an earlier PNG") {
  const std::string dir = make_tmpdir(), png = dir + "/held.png";
  std::ofstream(png) << "an earlier plot";
  auto bad = [&](StackedBarSpec s, const char* reason) {
    const std::string why = stacked_bar_png(s, png);
    CAPTURE(why);
    CHECK(why.rfind("stacked_bar_png: ", 0) == 0);
    CHECK(why.find(reason) != std::string::npos);
    CHECK(why.find('\n') == std::string::npos);
    CHECK(read_all(png) == "an earlier plot");
  };
  StackedBarSpec s = held();
  s.values.pop_back();
  bad(s, "3 layers but values for 2");
  s = held();
  s.values[1].push_back(1);
  bad(s, "layer '.grad' has 5 values for 4 bars");
  s = held();
  s.values[2][3] = -1;
  bad(s, "bar 'ZeRO-3 (FSDP)'");
  s = held();
  s.values[0][0] = std::nan("");
  bad(s, "not a finite value >= 0");
  s = held();
  s.labels = {};
  s.values = {{}, {}, {}};
  bad(s, "nothing to draw");
  s = held();
  s.labels[0] = "a \"quoted\" label";
  bad(s, "holds a \"");
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 1);  // no temporaries left
  fs::remove_all(dir);
}
