// kernels/cuda/matmul.cu run by the emulation: every kernel of the family against
// d2l::kernels::cpu::gemm and against a direct double-precision loop, on shapes that are not
// multiples of any tile, all transpose combinations, alpha/beta; the warp-tiled kernel also on shapes
// around its 128x128x8 tiles, K below its slice, and on data whose alignment rules its float4 loads
// in or out; the tiled kernel with one __syncthreads removed must be wrong, identically on every run;
// the launch log covers the family.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "check.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/emu/cuda_emu.hpp"  // for the broken kernel below
#include "kernels/emu/kernels.hpp"

namespace cpu = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
using d2l::test::close;
using d2l::test::lcg_data;
using kemu::GemmKernel;

// ---- matmul_kernel2_tiled from kernels/cuda/matmul.cu with its first __syncthreads removed:
// threads read the tiles before the others have stored their elements.
namespace D2L_CUDA_NS::testing {
constexpr int kTile = 16;
__global__ void tiled_missing_sync(int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  D2L_SHARED(float, As, [kTile][kTile]);
  D2L_SHARED(float, Bs, [kTile][kTile]);
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = int64_t(blockIdx.y) * kTile + ty, j = int64_t(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    As[ty][tx] = (i < M && k0 + tx < K) ? A[i * K + k0 + tx] : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && j < N) ? B[(k0 + ty) * N + j] : 0.0f;
    // (missing: __syncthreads();)
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (i < M && j < N) C[i * N + j] = acc;
}
}  // namespace D2L_CUDA_NS::testing

namespace {

// C = alpha * op(A) @ op(B) + beta * C in double, indexing the stored layouts directly.
using d2l::test::ref_gemm;

struct Shape {
  int64_t M, N, K;
};
// Odd sizes around the tiles (16 for kernels 1-2, 64x64x16 for kernel 3, 128x128x8 for kernel 4).
const Shape kShapes[] = {{1, 1, 1}, {17, 33, 9}, {65, 31, 70}, {3, 130, 17}, {130, 2, 33}, {64, 64, 16}};
const GemmKernel kKernels[] = {GemmKernel::naive, GemmKernel::tiled, GemmKernel::regblock, GemmKernel::warptiled};
const char* kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::naive: return "naive";
    case GemmKernel::tiled: return "tiled";
    case GemmKernel::regblock: return "regblock";
    case GemmKernel::warptiled: return "warptiled";
  }
  return "?";
}

// One case: emulated kernel vs double loop and vs cpu::gemm. Tolerance: float accumulation of K
// products of size <= 1: atol 1e-5 (K + 1) against double, twice that against another float GEMM.
// `shift` floats before A, B and C in their buffers: 1 makes every address misaligned for float4.
bool run_case(kemu::Stream stream, GemmKernel kernel, bool ta, bool tb, Shape s, float alpha, float beta,
              uint32_t seed, int shift = 0) {
  auto A = lcg_data(s.M * s.K, seed), B = lcg_data(s.K * s.N, seed + 1), C0 = lcg_data(s.M * s.N, seed + 2);
  auto C = C0, Ccpu = C0;
  if (beta == 0.0f)  // C must not be read: garbage in, no NaN out
    C.assign(C.size(), std::numeric_limits<float>::quiet_NaN());
  std::vector<float> a(shift), b(shift), c(shift);  // copies `shift` floats past new's 16-byte alignment
  a.insert(a.end(), A.begin(), A.end());
  b.insert(b.end(), B.begin(), B.end());
  c.insert(c.end(), C.begin(), C.end());
  kemu::gemm(stream, kernel, ta, tb, s.M, s.N, s.K, alpha, a.data() + shift, b.data() + shift, beta,
             c.data() + shift);
  C.assign(c.begin() + shift, c.end());
  cpu::gemm(cpu::serial_ctx(), ta, tb, s.M, s.N, s.K, alpha, A.data(), B.data(), beta, Ccpu.data());
  auto ref = ref_gemm(ta, tb, s.M, s.N, s.K, alpha, A, B, beta, C0);
  const double atol = 1e-5 * static_cast<double>(s.K + 1);
  bool ok = close(ref, C, atol, 1e-5, "emu gemm vs double");
  ok = close(Ccpu, C, 2 * atol, 2e-5, "emu gemm vs cpu gemm") && ok;
  if (!ok)
    std::printf("  kernel %s ta %d tb %d M %lld N %lld K %lld alpha %g beta %g shift %d\n", kernel_name(kernel), ta,
                tb, (long long)s.M, (long long)s.N, (long long)s.K, alpha, beta, shift);
  return ok;
}

int failures_over_all_cases(kemu::Stream stream) {
  int failures = 0;
  uint32_t seed = 1;
  for (GemmKernel kernel : kKernels)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const Shape& s : kShapes) {
          failures += !run_case(stream, kernel, ta, tb, s, 1.0f, 0.0f, seed++);
          failures += !run_case(stream, kernel, ta, tb, s, 0.5f, -2.0f, seed++);
        }
  return failures;
}

std::vector<float> run_broken(kemu::Stream stream, int64_t M, int64_t N, int64_t K, const std::vector<float>& A,
                              const std::vector<float>& B) {
  std::vector<float> C(static_cast<size_t>(M * N), 0.0f);
  const d2l::cuda_emu::dim3 grid(static_cast<unsigned>((N + 15) / 16), static_cast<unsigned>((M + 15) / 16));
  const d2l::cuda_emu::dim3 block(16, 16);
  D2L_LAUNCH(kemu::testing::tiled_missing_sync, grid, block, 0, stream)(M, N, K, A.data(), B.data(), C.data());
  return C;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace

TEST_CASE("emulated GEMM kernels match cpu::gemm and a double loop: odd shapes, all transposes") {
  CHECK(failures_over_all_cases(nullptr) == 0);
}

TEST_CASE("emulated GEMM kernels on 2 device threads" * doctest::test_suite("threads")) {
  cpu::ThreadPool pool(1);
  const cpu::Ctx ctx{2, &pool};
  CHECK(failures_over_all_cases(&ctx) == 0);
}

// kernel4 (128x128 block tiles, K slices of 8, float4 loads where the addresses allow): shapes
// that are not multiples of its tiles, K below one slice, exact tiles, several blocks and slices;
// sizes that are multiples of 4 (float4 loads and stores, edges inside a float4's reach), and the
// same data shifted by one float (every float4 misaligned: the scalar path, or an error from the
// emulated __ldg if a float4 load were tried).
TEST_CASE("warp-tiled GEMM: tile edges, K below a slice, float4 and scalar loads, all transposes") {
  const Shape shapes[] = {{1, 1, 1},    {3, 5, 7},     {67, 33, 129}, {130, 129, 3}, {128, 128, 8},
                          {129, 4, 12}, {132, 68, 20}, {4, 260, 36},  {256, 192, 160}};
  int failures = 0;
  uint32_t seed = 100;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : shapes) {
        failures += !run_case(nullptr, GemmKernel::warptiled, ta, tb, s, 1.0f, 0.0f, seed++);
        failures += !run_case(nullptr, GemmKernel::warptiled, ta, tb, s, 0.5f, -2.0f, seed++);
      }
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int shift : {1, 4})  // misaligned, and aligned again at another address
        failures += !run_case(nullptr, GemmKernel::warptiled, ta, tb, {132, 68, 20}, 0.5f, -2.0f, seed++, shift);
  CHECK(failures == 0);
}

TEST_CASE("M or N = 0 is a no-op; K = 0 gives C = beta * C") {
  std::vector<float> C{1.0f, 2.0f};
  for (GemmKernel kernel : kKernels) {  // C *= 3 once per kernel
    kemu::gemm(nullptr, kernel, false, false, 0, 2, 3, 1.0f, nullptr, nullptr, 0.0f, C.data());
    kemu::gemm(nullptr, kernel, false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 3.0f, C.data());
  }
  CHECK(C == std::vector<float>{81.0f, 162.0f});
}

TEST_CASE("tiled GEMM without its first __syncthreads is wrong, the same way on every run" *
          doctest::test_suite("threads")) {
  const int64_t M = 33, N = 17, K = 40;
  auto A = lcg_data(M * K, 7), B = lcg_data(K * N, 8);
  std::vector<float> ref(static_cast<size_t>(M * N));
  cpu::gemm(cpu::serial_ctx(), false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, ref.data());
  const auto first = run_broken(nullptr, M, N, K, A, B);
  std::printf("(expected mismatches of the broken kernel follow)\n");
  CHECK_FALSE(close(ref, first, 1e-3, 1e-3, "broken tiled"));
  int nans = 0;
  for (float x : first) nans += std::isnan(x);
  CHECK(nans > 0);  // it read shared memory nobody had written yet: NaN
  CHECK(same_bits(first, run_broken(nullptr, M, N, K, A, B)));
  cpu::ThreadPool pool(1);
  const cpu::Ctx ctx{2, &pool};
  CHECK(same_bits(first, run_broken(&ctx, M, N, K, A, B)));  // other block-to-thread assignment, same bits
  // The correct tiled kernel on the same data passes.
  std::vector<float> good(ref.size());
  kemu::gemm(nullptr, GemmKernel::tiled, false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, good.data());
  CHECK(close(ref, good, 1e-5 * (K + 1), 1e-5, "tiled"));
}

TEST_CASE("the launch log covers every kernel of matmul.cu") {
  d2l::cuda_emu::clear_launch_log();
  std::vector<float> A(9, 1.0f), B(9, 1.0f), C(9);
  for (GemmKernel kernel : kKernels)
    kemu::gemm(nullptr, kernel, false, false, 3, 3, 3, 1.0f, A.data(), B.data(), 0.0f, C.data());
  const auto log = d2l::cuda_emu::launch_log();
  const char* family[] = {"matmul_kernel1_naive", "matmul_kernel2_tiled", "matmul_kernel3_regblock",
                          "matmul_kernel4_warptiled"};
  int covered = 0;
  for (const char* name : family) covered += log.count(name) == 1 && log.at(name) == 1;
  CHECK(covered == 4);
  CHECK(log.size() == 4);
}

// Benchmark (meson benchmark emu_matmul_speed; skipped by meson test): validate, then time
// 256^3 per kernel, on the calling thread and on 2 device threads. Minimum of 3 runs.
TEST_CASE("speed: emulated GEMM 256x256x256" * doctest::skip()) {
  const int64_t n = 256;
  auto A = lcg_data(n * n, 1), B = lcg_data(n * n, 2);
  std::vector<float> ref(n * n), C(n * n);
  cpu::gemm(cpu::serial_ctx(), false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, ref.data());
  cpu::ThreadPool pool(1);
  const cpu::Ctx two{2, &pool};
  for (kemu::Stream stream : {static_cast<kemu::Stream>(nullptr), &two})
    for (GemmKernel kernel : kKernels) {
      kemu::gemm(stream, kernel, false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());  // warm-up
      REQUIRE(close(ref, C, 1e-5 * (n + 1), 1e-5, "speed check"));
      double best = 1e30;
      for (int r = 0; r < 3; ++r) {
        auto t0 = std::chrono::steady_clock::now();
        kemu::gemm(stream, kernel, false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
        best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::printf("emu gemm %-9s threads %d: %8.2f ms  %6.3f GFLOP/s\n", kernel_name(kernel),
                  stream ? stream->threads : 1, best * 1e3, 2.0 * n * n * n / best * 1e-9);
    }
}
