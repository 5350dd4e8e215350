#include "core/plot.hpp"

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <unistd.h>

namespace d2l {

static std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string plot_png(const PlotSpec& spec, const std::string& png_path) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return "gnuplot not found (install the Debian package gnuplot-nox); no plot drawn";
  std::string tmp = png_path + ".tmp." + std::to_string(getpid());
  std::string script_path = tmp + ".gp";
  {
    std::ofstream gp(script_path);
    gp << "set terminal pngcairo size 640,420 enhanced font 'sans,10'\n"
       << "set output " << quote(tmp + ".png") << "\n"
       << "set title " << quote(spec.title) << "\nset xlabel " << quote(spec.xlabel) << "\nset ylabel "
       << quote(spec.ylabel) << "\nset grid\nset key bottom right\n";
    if (spec.logx) gp << "set logscale x 2\n";
    if (spec.ymin != 0 || spec.ymax != 0) gp << "set yrange [" << spec.ymin << ":" << spec.ymax << "]\n";
    gp << "plot ";
    for (size_t i = 0; i < spec.series.size(); ++i)
      gp << (i ? ", " : "") << "'-' using 1:2 with linespoints lw 2 title " << quote(spec.series[i].name);
    gp << "\n";
    for (auto& s : spec.series) {
      for (size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) gp << s.x[k] << " " << s.y[k] << "\n";
      gp << "e\n";
    }
    if (!gp) return "cannot write " + script_path;
  }
  std::string cmd = "gnuplot " + quote(script_path) + " 2>" + quote(tmp + ".err");
  int rc = std::system(cmd.c_str());
  std::string err;
  {
    std::ifstream e(tmp + ".err");
    std::getline(e, err);
  }
  std::remove(script_path.c_str());
  std::remove((tmp + ".err").c_str());
  if (rc != 0) {
    std::remove((tmp + ".png").c_str());
    return "gnuplot failed: " + err;
  }
  if (std::rename((tmp + ".png").c_str(), png_path.c_str()) != 0) return "cannot write " + png_path;
  return "";
}

}  // namespace d2l
