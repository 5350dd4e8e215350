// The GEMM family member is the caller's choice (core's set_gemm): each member runs once here, so that
// the coverage check of emu_ops (tests/kernel_coverage_main.cpp, --kernel-coverage) sees all six, and
// the 16-bit one.
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

// The 16-bit GEMMs (kernels/cuda/matmul16.cu's kernel2, matmul_mma.cu's kernel6), on both formats;
// tests/test_gemm16.cpp checks their values.
TEST_CASE("the 16-bit GEMMs run emulated, bfloat16 and float16") {
  namespace kemu = d2l::kernels::emu;
  using d2l::kernels::cpu::Float16;
  for (Float16 f : {Float16::bf16, Float16::f16}) {
    const uint16_t one = f == Float16::bf16 ? 0x3F80 : 0x3C00;
    std::vector<uint16_t> A(6, one), B(6, one);
    for (kemu::GemmKernel k : {kemu::GemmKernel::tiled, kemu::GemmKernel::mma}) {
      std::vector<float> C(4, 0.0f);
      kemu::gemm16(nullptr, k, f, false, false, 2, 2, 3, 1.0f, A.data(), B.data(), 0.0f, C.data());
      CHECK(C == std::vector<float>(4, 3.0f));
    }
  }
}
