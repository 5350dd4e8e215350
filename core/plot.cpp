#include "core/plot.hpp"

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <vector>

#include "core/cli.hpp"
#include "core/io/atomic_file.hpp"

namespace d2l {

static std::string quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

// Runs gnuplot on `script` with stderr to `err`, answering Ctrl-C / SIGTERM within a second: the
// child is stopped and Interrupted thrown (std::system would ignore SIGINT while gnuplot draws).
// Returns gnuplot's exit status, or -1 if it could not start.
static int run_gnuplot(const std::string& script, const std::string& err) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = 0;
  char* argv[] = {const_cast<char*>("gnuplot"), const_cast<char*>(script.c_str()), nullptr};
  int rc = ::posix_spawnp(&pid, "gnuplot", &actions, nullptr, argv, environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) return -1;
  for (;;) {
    int status = 0;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    if (r < 0 && errno != EINTR) return -1;
    if (interrupted()) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -2;
    }
    ::usleep(20000);
  }
}

// Writes `body` (the gnuplot commands after the terminal and output lines) to a temporary script,
// runs gnuplot on it and renames the drawn PNG over png_path. The script, gnuplot's messages and
// the PNG being drawn are temporary files of png_path (io::temporary_name: named for this process,
// so a later run removes them if this one is killed). Returns "" or why not.
static std::string render(const std::string& body, const std::string& png_path) {
  check_interrupt();  // after Ctrl-C nothing more is drawn (the data may come from skipped work)
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0)
    return "gnuplot not found (install the Debian package gnuplot-nox); no plot drawn";
  std::string png_tmp, script_path, err_path;
  try {
    io::remove_stale_temporaries(png_path);
    png_tmp = io::temporary_name(png_path);
    script_path = io::temporary_name(png_path);
    err_path = io::temporary_name(png_path);
  } catch (const std::exception& e) {
    return e.what();
  }
  struct Cleanup {
    std::vector<std::string> paths;
    ~Cleanup() {
      for (auto& p : paths) std::remove(p.c_str());
    }
  } cleanup{{png_tmp, script_path, err_path}};
  {
    std::ofstream gp(script_path);
    gp << "set terminal pngcairo size 640,420 enhanced font 'sans,10'\n"
       << "set output " << quote(png_tmp) << "\n"
       << body;
    if (!gp) return "cannot write " + script_path;
  }
  int rc = run_gnuplot(script_path, err_path);
  if (rc == -2) throw Interrupted(interrupt_signal());
  std::string err;
  {
    std::ifstream e(err_path);
    std::getline(e, err);
  }
  if (rc != 0) return "gnuplot failed: " + (rc == -1 ? std::string("cannot run it") : err);
  if (std::rename(png_tmp.c_str(), png_path.c_str()) != 0) return "cannot write " + png_path;
  return "";
}

std::string plot_png(const PlotSpec& spec, const std::string& png_path) {
  std::ostringstream gp;
  gp << "set title " << quote(spec.title) << "\nset xlabel " << quote(spec.xlabel) << "\nset ylabel "
     << quote(spec.ylabel) << "\nset grid\nset key " << spec.key << "\n";
  if (spec.logx) gp << "set logscale x 2\n";
  if (spec.ymin != 0 || spec.ymax != 0) gp << "set yrange [" << spec.ymin << ":" << spec.ymax << "]\n";
  if (!spec.xtics.empty()) {  // set xtics ("1" 1, "2" 2, "4" 4): these ticks only
    gp << "set xtics (";
    for (size_t i = 0; i < spec.xtics.size(); ++i) {
      std::ostringstream label;
      label << spec.xtics[i];
      gp << (i ? ", " : "") << quote(label.str()) << " " << spec.xtics[i];
    }
    gp << ")\n";
  }
  bool yerr = false;
  for (auto& s : spec.series) yerr = yerr || !s.yerr.empty();
  // Room around the points so the end bars, or the points on the end ticks, are not cut off.
  if (yerr) gp << "set offsets graph 0.03, graph 0.03, graph 0.05, graph 0.05\n";
  else if (!spec.xtics.empty()) gp << "set offsets graph 0.03, graph 0.03, 0, 0\n";
  gp << "plot ";
  for (size_t i = 0; i < spec.series.size(); ++i) {
    gp << (i ? ", " : "") << "'-' using 1:2 with linespoints lw 2 title " << quote(spec.series[i].name);
    // Error bars: red bars and points over the line (matplotlib's errorbar(ecolor='red', fmt='ro')).
    if (!spec.series[i].yerr.empty()) gp << ", '-' using 1:2:3 with yerrorbars lc rgb 'red' pt 7 notitle";
  }
  gp << "\n";
  for (auto& s : spec.series) {
    for (int pass = 0; pass < (s.yerr.empty() ? 1 : 2); ++pass) {
      for (size_t k = 0; k < s.x.size() && k < s.y.size(); ++k) {
        gp << s.x[k] << " " << s.y[k];
        if (pass == 1) gp << " " << (k < s.yerr.size() ? s.yerr[k] : 0.0);
        gp << "\n";
      }
      gp << "e\n";
    }
  }
  return render(gp.str(), png_path);
}

std::string bar_png(const BarSpec& spec, const std::string& png_path) {
  const size_t n = spec.labels.size();
  if (spec.means.size() != n || (!spec.errors.empty() && spec.errors.size() != n))
    return "bar_png: " + std::to_string(n) + " labels, " + std::to_string(spec.means.size()) + " means and " +
           std::to_string(spec.errors.size()) + " errors do not match; no plot drawn";
  std::ostringstream gp;
  gp << "set title " << quote(spec.title) << "\nset ylabel " << quote(spec.ylabel) << "\n"
     << "set grid ytics\nunset key\nset yrange [0:*]\nset xrange [-0.6:" << (static_cast<double>(n) - 0.4) << "]\n"
     << "set boxwidth 0.6\nset style fill solid 0.5 border -1\nset xtics (";
  for (size_t i = 0; i < n; ++i) gp << (i ? ", " : "") << quote(spec.labels[i]) << " " << i;
  gp << ")\nset errorbars large\n";
  // Bars (blue, half transparent as alpha=0.5), then the error bars (red) on top of them.
  gp << "plot '-' using 1:2 with boxes lc rgb '#1f77b4'";
  if (!spec.errors.empty()) gp << ", '-' using 1:2:3 with yerrorbars lc rgb 'red' lw 1.5 pt 0";
  gp << "\n";
  for (int pass = 0; pass < (spec.errors.empty() ? 1 : 2); ++pass) {
    for (size_t i = 0; i < n; ++i) {
      gp << i << " " << spec.means[i];
      if (pass == 1) gp << " " << spec.errors[i];
      gp << "\n";
    }
    gp << "e\n";
  }
  return render(gp.str(), png_path);
}

// Why `spec` cannot be drawn, or "".
static std::string stacked_bar_problem(const StackedBarSpec& spec) {
  const size_t bars = spec.labels.size(), layers = spec.layers.size();
  if (bars == 0 || layers == 0) return std::to_string(bars) + " bars of " + std::to_string(layers) + " layers: nothing to draw";
  if (spec.values.size() != layers)
    return std::to_string(layers) + " layers but values for " + std::to_string(spec.values.size());
  for (size_t l = 0; l < layers; ++l) {
    if (spec.values[l].size() != bars)
      return "layer " + quote(spec.layers[l]) + " has " + std::to_string(spec.values[l].size()) + " values for " +
             std::to_string(bars) + " bars";
    for (size_t b = 0; b < bars; ++b)
      if (!std::isfinite(spec.values[l][b]) || spec.values[l][b] < 0)
        return "layer " + quote(spec.layers[l]) + ", bar " + quote(spec.labels[b]) + ": " +
               std::to_string(spec.values[l][b]) + " is not a finite value >= 0";
  }
  for (auto& label : spec.labels)  // written "label" in the data
    if (label.find_first_of("\"\n") != std::string::npos) return "the label " + quote(label) + " holds a \" or a newline";
  return "";
}

std::string stacked_bar_png(const StackedBarSpec& spec, const std::string& png_path) {
  const std::string why = stacked_bar_problem(spec);
  if (!why.empty()) return "stacked_bar_png: " + why + "; no plot drawn";
  std::ostringstream gp;
  // The legend inverted: top to bottom as the segments are stacked.
  gp << "set title " << quote(spec.title) << "\nset ylabel " << quote(spec.ylabel) << "\n"
     << "set grid ytics\nset key top right invert reverse Left\nset yrange [0:*]\n"
     << "set style data histograms\nset style histogram rowstacked\nset style fill solid border -1\nset boxwidth 0.75\n";
  // The data: a row per bar, its label then one column per layer.
  gp << "$data << EOD\n";
  for (size_t b = 0; b < spec.labels.size(); ++b) {
    gp << '"' << spec.labels[b] << '"';
    for (auto& layer : spec.values) gp << " " << layer[b];
    gp << "\n";
  }
  gp << "EOD\nplot ";
  for (size_t l = 0; l < spec.layers.size(); ++l)
    gp << (l ? ", " : "") << "$data using " << l + 2 << (l ? "" : ":xtic(1)") << " title " << quote(spec.layers[l]);
  gp << "\n";
  return render(gp.str(), png_path);
}

}  // namespace d2l
