// --conv and --gemm for the benchmarks of whole networks: the chapter programs' flags (chapters/harness,
// core/cli).
#pragma once
#include <cstdio>
#include <exception>
#include <string>

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

}  // namespace d2l::bench
