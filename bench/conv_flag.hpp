// --conv and --gemm for the benchmarks of whole networks: the chapter programs' flags (chapters/harness,
// core/cli).
#pragma once
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "bench/bench_util.hpp"
#include "chapters/harness/harness.hpp"
#include "core/ops/op.hpp"
#include "kernels/cpu/kernels.hpp"

namespace d2l::bench {

// --conv NAME: selects the convolution member as the chapter programs' --conv does (chapters/harness);
// false, with the harness's error line, for a name it does not know.
inline bool apply_conv(const std::string& name) {
  harness::Conv conv;
  conv.name = name;
  try {
    conv.apply();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  std::printf("  conv2d member: %s\n", name.c_str());
  return true;
}

// --gemm NAME: selects the GEMM as the chapter programs' --gemm does (core/ops/gemm.cpp) and prints
// the CPU's; false, with the error line, for a name it does not know.
inline bool apply_gemm(const std::string& name) {
  try {
    detail::set_gemm(name);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return false;
  }
  std::printf("  %s\n", kernels::cpu::gemm_description().c_str());
  return true;
}

// The flags of an epoch or step benchmark (lab_cnn_epoch_bench, lenet_epoch_bench, resnet18_layer_bench):
// `defaults`, then the command line (parse_setup_flags: the program's count flag, at least min_count,
// `count_help` its argument in the usage line), then --conv applied, and --gemm where the program takes
// it. A bad flag prints the usage or the error line and exits with status 2.
inline SetupFlags setup_flags(int argc, char** argv, const std::string& program, const std::string& count_flag,
                              const std::string& count_help, int64_t min_count, SetupFlags defaults, bool gemm) {
  const std::string usage = "usage: " + program + " [" + count_flag + " " + count_help +
                            "] [--repeats R] [--setup all|1x2|1x1|2x1] [--conv NAME]" + (gemm ? " [--gemm NAME]" : "") +
                            " [--precision fp32|bf16]";
  const std::string error = "error: " + count_flag + " must be >= " + std::to_string(min_count) +
                            ", --repeats >= 1, --setup one of all, 1x2, 1x1, 2x1, --precision fp32 or bf16";
  if (!parse_setup_flags(argc, argv, count_flag.c_str(), min_count, usage.c_str(), error.c_str(), defaults) ||
      !apply_conv(defaults.conv) || (gemm && !apply_gemm(defaults.gemm)))
    std::exit(2);
  return defaults;
}

}  // namespace d2l::bench
