// The GEMM family member is the caller's choice (core's set_gemm): each member runs once here, so that
// the coverage check of emu_ops (tests/kernel_coverage_main.cpp, --kernel-coverage) sees all five.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "kernels/emu/kernels.hpp"

TEST_CASE("the GEMM family runs emulated: naive, tiled, register-blocked, warp-tiled, tf32 and mma") {
  namespace kemu = d2l::kernels::emu;
  // The GEMM family member is chosen by the caller: run each once here.
  std::vector<float> A(6, 1.0f), B(6, 1.0f), C(4);
  for (kemu::GemmKernel k : {kemu::GemmKernel::naive, kemu::GemmKernel::tiled, kemu::GemmKernel::regblock,
                             kemu::GemmKernel::warptiled, kemu::GemmKernel::tf32, kemu::GemmKernel::mma}) {
    std::fill(C.begin(), C.end(), 0.0f);
    kemu::gemm(nullptr, k, false, false, 2, 2, 3, 1.0f, A.data(), B.data(), 0.0f, C.data());
    CHECK(C == std::vector<float>(4, 3.0f));
  }
}
