// Small helpers shared by the benchmarks: wall and CPU clocks, min/median of repeats, a one-line
// banner with what the numbers depend on (OpenBLAS kernel set, load average), and the
// machine-readable "RESULT <key> <value>" lines bench/compare.sh collects.
#pragma once
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

extern "C" char* openblas_get_corename(void);  // OpenBLAS: the kernel set it picked (DYNAMIC_ARCH)

namespace d2l::bench {

inline double wall_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// CPU seconds used by all threads of this process so far (user + system). On a loaded machine the
// wall time grows with the load; the CPU time much less, so both are printed.
inline double cpu_now() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// n values in [-1, 1) from a seeded LCG: the same inputs in every run and every benchmark.
inline std::vector<float> random_data(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t state = seed * 2654435761u + 1;
  for (auto& x : v) {
    state = state * 1664525u + 1013904223u;
    x = static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  }
  return v;
}

// The process's peak resident memory so far in MB (VmHWM; ru_maxrss in PyTorch's script: the same).
inline double peak_rss_mb() {
  std::ifstream f("/proc/self/status");
  std::string key;
  double kb = -1;
  while (f >> key)
    if (key == "VmHWM:") {
      f >> kb;
      break;
    }
  return kb / 1024.0;
}

// The 1-minute load average (a 2-core machine is busy beyond 2).
inline double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  f >> l;
  return l;
}

struct Stats {
  double min = 0, median = 0;      // wall seconds per repeat
  double cpu_min = 0, cpu_median = 0;  // CPU seconds (all threads) per repeat
};

inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Runs fn `warmup` times untimed, then `repeats` times timed.
inline Stats time_it(const std::function<void()>& fn, int warmup, int repeats) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> wall, cpu;
  for (int i = 0; i < repeats; ++i) {
    const double w0 = wall_now(), c0 = cpu_now();
    fn();
    wall.push_back(wall_now() - w0);
    cpu.push_back(cpu_now() - c0);
  }
  Stats s;
  s.min = *std::min_element(wall.begin(), wall.end());
  s.median = median_of(wall);
  s.cpu_min = *std::min_element(cpu.begin(), cpu.end());
  s.cpu_median = median_of(cpu);
  return s;
}

inline void banner(const char* what) {
  std::printf("%s\n  OpenBLAS kernels: %s (OPENBLAS_CORETYPE=%s), load average %.2f\n", what, openblas_get_corename(),
              std::getenv("OPENBLAS_CORETYPE") ? std::getenv("OPENBLAS_CORETYPE") : "unset", load_average());
}

// The flags of the epoch and step benchmarks: --COUNT N (--steps or --batch), --repeats R and
// --setup all|1x2|1x1|2x1 (bench/compare.sh runs one setup at a time, next to PyTorch's), --conv NAME,
// --gemm NAME. Returns
// false, having printed `usage`, on a flag it does not know; a count below min_count, repeats below
// 1 or a setup outside the four print `error` and return false too.
struct SetupFlags {
  int64_t count;
  int repeats;
  std::string setup = "all";
  std::string conv = "auto";  // --conv: the convolution member (bench/conv_flag.hpp applies it)
  std::string gemm = "auto";  // --gemm: the GEMM member (bench/conv_flag.hpp applies it)
  std::string precision = "fp32";  // --precision fp32|bf16: bf16 runs each step's forward and backward under autocast
};
inline bool parse_setup_flags(int argc, char** argv, const char* count_flag, int64_t min_count, const char* usage,
                              const char* error, SetupFlags& f) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == count_flag && i + 1 < argc) f.count = std::atoll(argv[++i]);
    else if (a == "--repeats" && i + 1 < argc) f.repeats = std::atoi(argv[++i]);
    else if (a == "--setup" && i + 1 < argc) f.setup = argv[++i];
    else if (a == "--conv" && i + 1 < argc) f.conv = argv[++i];
    else if (a == "--gemm" && i + 1 < argc) f.gemm = argv[++i];
    else if (a == "--precision" && i + 1 < argc) f.precision = argv[++i];
    else {
      std::fprintf(stderr, "%s\n", usage);
      return false;
    }
  }
  if (f.count < min_count || f.repeats < 1 || (f.setup != "all" && f.setup != "1x2" && f.setup != "1x1" && f.setup != "2x1") ||
      (f.precision != "fp32" && f.precision != "bf16")) {
    std::fprintf(stderr, "%s\n", error);
    return false;
  }
  return true;
}

// One figure for bench/compare.sh: "RESULT <key> <value>".
inline void result(const std::string& key, double value) { std::printf("RESULT %s %.6g\n", key.c_str(), value); }

}  // namespace d2l::bench
