// kernels/cuda/matmul.cu run by the emulation: every kernel of the family against
// d2l::kernels::cpu::gemm and against a direct double-precision loop, on shapes that are not
// multiples of any tile, all transpose combinations, alpha/beta; the warp-tiled kernel also on shapes
// around its 128x128x8 tiles, K below its slice, and on data whose alignment rules its float4 loads
// in or out; the tiled kernel with one __syncthreads removed must be wrong, identically on every run;
// the launch log covers the family. The TF32 tensor-core kernel (kernel5) is held to TF32's error
// bound instead of FP32's, and must be exact where TF32 is (small integers), round its inputs to
// the nearest TF32, and be measurably less precise than FP32 where inputs are not TF32 values.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>
#include <span>
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
// Odd sizes around the tiles (16 for kernels 1-2, 64x64x16 for kernel 3, 128x128x8 for kernel 4,
// 128x128x16 for kernel 6).
const Shape kShapes[] = {{1, 1, 1}, {17, 33, 9}, {65, 31, 70}, {3, 130, 17}, {130, 2, 33}, {64, 64, 16}};
const GemmKernel kKernels[] = {GemmKernel::naive, GemmKernel::tiled, GemmKernel::regblock, GemmKernel::warptiled,
                               GemmKernel::tf32, GemmKernel::mma};
bool tf32_kernel(GemmKernel k) { return k == GemmKernel::tf32 || k == GemmKernel::mma; }
const char* kernel_name(GemmKernel k) {
  switch (k) {
    case GemmKernel::naive: return "naive";
    case GemmKernel::tiled: return "tiled";
    case GemmKernel::regblock: return "regblock";
    case GemmKernel::warptiled: return "warptiled";
    case GemmKernel::tf32: return "tf32";
    case GemmKernel::mma: return "mma";
  }
  return "?";
}

// TF32's error bound for C = alpha op(A) op(B) + beta C0, element by element:
//   |C - C_exact| <= (K + 2) 2^-11 |alpha| sum_k |op(A)(i, k)| |op(B)(k, j)| + 2^-22 (|alpha| S + |beta C0|) + 1e-30
// Each input is rounded to TF32 (relative error <= 2^-11: 10 stored mantissa bits, round to nearest), so
// a product is off by <= ~2 * 2^-11 of |a||b|; K + 2 covers that and the FP32 sums with room for a
// tensor core that adds in another order. The second term: FP32's rounding of alpha * acc + beta * C0.
std::vector<double> tf32_bound(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                               const std::vector<float>& A, const std::vector<float>& B, double beta,
                               const std::vector<float>& C0) {
  std::vector<float> absA(A.size()), absB(B.size());
  for (size_t i = 0; i < A.size(); ++i) absA[i] = std::fabs(A[i]);
  for (size_t i = 0; i < B.size(); ++i) absB[i] = std::fabs(B[i]);
  auto S = ref_gemm(ta, tb, M, N, K, 1.0, absA, absB, 0.0, C0);  // sum_k |a| |b|
  for (size_t e = 0; e < S.size(); ++e)
    S[e] = (K + 2) * std::ldexp(1.0, -11) * std::fabs(alpha) * S[e] +
           std::ldexp(1.0, -22) * (std::fabs(alpha) * S[e] + (beta == 0.0 ? 0.0 : std::fabs(beta * C0[e]))) + 1e-30;
  return S;
}

// Elements of got outside ref +- bound (NaN is outside), printing the first few.
int64_t outside(const std::vector<double>& ref, const std::vector<float>& got, const std::vector<double>& bound,
                const char* what) {
  int64_t bad = 0;
  for (size_t e = 0; e < ref.size(); ++e)
    if (!(std::fabs(double(got[e]) - ref[e]) <= bound[e]) && bad++ < 5)
      std::printf("  %s mismatch at %zu: ref %.9g got %.9g bound %.3g\n", what, e, ref[e], double(got[e]), bound[e]);
  return bad;
}

// One case: emulated kernel vs double loop and vs cpu::gemm. Tolerance: float accumulation of K
// products of size <= 1: atol 1e-5 (K + 1) against double, twice that against another float GEMM;
// for tf32, tf32_bound against double (cpu::gemm is no closer to it than the double loop).
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
  bool ok;
  if (tf32_kernel(kernel)) {
    ok = outside(ref, C, tf32_bound(ta, tb, s.M, s.N, s.K, alpha, A, B, beta, C0), "emu tf32 gemm vs double") == 0;
  } else {
    ok = close(ref, C, atol, 1e-5, "emu gemm vs double");
    ok = close(Ccpu, C, 2 * atol, 2e-5, "emu gemm vs cpu gemm") && ok;
  }
  if (!ok)
    std::printf("  kernel %s ta %d tb %d M %lld N %lld K %lld alpha %g beta %g shift %d\n", kernel_name(kernel), ta,
                tb, (long long)s.M, (long long)s.N, (long long)s.K, alpha, beta, shift);
  return ok;
}

// run_case on every transpose and shape, with alpha 1, beta 0 and with alpha 0.5, beta -2, each case
// on its own data (seeds from `seed` on): how many failed.
int failures_over_shapes(kemu::Stream stream, GemmKernel kernel, std::span<const Shape> shapes, uint32_t& seed) {
  int failures = 0;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const Shape& s : shapes) {
        failures += !run_case(stream, kernel, ta, tb, s, 1.0f, 0.0f, seed++);
        failures += !run_case(stream, kernel, ta, tb, s, 0.5f, -2.0f, seed++);
      }
  return failures;
}

int failures_over_all_cases(kemu::Stream stream) {
  int failures = 0;
  uint32_t seed = 1;
  for (GemmKernel kernel : kKernels) failures += failures_over_shapes(stream, kernel, kShapes, seed);
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
  uint32_t seed = 100;
  int failures = failures_over_shapes(nullptr, GemmKernel::warptiled, shapes, seed);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int shift : {1, 4})  // misaligned, and aligned again at another address
        failures += !run_case(nullptr, GemmKernel::warptiled, ta, tb, {132, 68, 20}, 0.5f, -2.0f, seed++, shift);
  CHECK(failures == 0);
}

// kernel5 (tensor cores, 128x128 block tiles, K slices of 16, TF32 inputs) against the double loop within
// tf32_bound: squares around one block tile, odd shapes, all transposes, alpha/beta (beta = 0 with C
// full of NaN: C not read), misaligned data (the scalar loads). The emulation does each warp's
// fragment work once per lane (32 times over): the shapes stay small.
// kernel6 (mma.sync, ldmatrix, cp.async) the same, with K past the three slices in flight.
TEST_CASE("TF32 GEMM: within TF32's bound on squares, odd shapes, all transposes, alpha and beta") {
  const Shape shapes[] = {{64, 64, 64}, {128, 128, 128}, {130, 130, 130}, {1, 1, 1}, {17, 33, 9}, {200, 70, 45}};
  for (GemmKernel kernel : {GemmKernel::tf32, GemmKernel::mma}) {
    CAPTURE(kernel_name(kernel));
    uint32_t seed = 300;
    int failures = failures_over_shapes(nullptr, kernel, shapes, seed);
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        failures += !run_case(nullptr, kernel, ta, tb, {132, 68, 20}, 0.5f, -2.0f, seed++, 1);
    CHECK(failures == 0);
  }
}

// The GEMMs of the book's networks at batch 2 (per image for the convolutions: M = OC, N = OH*OW,
// K = C*KH*KW): forward C = W X, backward_data op(W)^T dY, backward_weight dY X^T.
TEST_CASE("TF32 GEMM on LeNet and ResNet-like shapes, forward and backward") {
  struct Case {
    const char* name;
    bool ta, tb;
    Shape s;
  };
  const Case cases[] = {
      {"LeNet conv1 forward (20 x 676 x 9)", false, false, {20, 676, 9}},
      {"LeNet conv2 forward (50 x 81 x 500)", false, false, {50, 81, 500}},
      {"LeNet conv2 backward_data (500 x 81 x 50)", true, false, {500, 81, 50}},
      {"LeNet conv2 backward_weight (50 x 500 x 81)", false, true, {50, 500, 81}},
      {"LeNet dense 400 -> 120, batch 2 (2 x 120 x 400)", false, true, {2, 120, 400}},
      {"ResNet 3x3 64 -> 64 at 7x7 (64 x 49 x 576)", false, false, {64, 49, 576}},
  };
  int failures = 0;
  for (GemmKernel kernel : {GemmKernel::tf32, GemmKernel::mma}) {
    uint32_t seed = 400;
    for (const Case& c : cases) {
      const bool ok = run_case(nullptr, kernel, c.ta, c.tb, c.s, 1.0f, 0.0f, seed++);
      if (!ok) std::printf("  (%s, %s)\n", c.name, kernel_name(kernel));
      failures += !ok;
    }
  }
  CHECK(failures == 0);
}

// What tells a TF32 kernel from an FP32 one (and from one that forgot to round its inputs):
// - small integers are TF32 values and their products and sums are exact in FP32: C is exact;
// - 1 + 3 * 2^-12 lies between the TF32 values 1 and 1 + 2^-10, nearer the second: rounded, a row of
//   them times ones sums to K (1 + 2^-10) exactly; truncated (what the tensor core does to unrounded
//   inputs) to K; FP32 gives K (1 + 3 * 2^-12);
// - on general data the error exceeds FP32's bound (K + 2) 2^-24 sum |a||b| many times over, yet
//   stays inside TF32's (so a kernel that silently ran FP32 SIMT fails this test).
void tf32_signature(GemmKernel kernel) {
  const int64_t M = 70, N = 40, K = 96;
  std::vector<float> A(M * K), B(K * N), C(M * N);
  uint32_t r = 12345;
  auto small_int = [&r] { return static_cast<float>(static_cast<int>((r = r * 1664525u + 1013904223u) >> 28) - 8); };
  for (float& x : A) x = small_int();
  for (float& x : B) x = small_int();
  std::vector<float> C0(M * N);
  for (float& x : C0) x = small_int();
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      C = C0;
      kemu::gemm(nullptr, kernel, ta, tb, M, N, K, 1.0f, A.data(), B.data(), 1.0f, C.data());
      const auto ref = ref_gemm(ta, tb, M, N, K, 1.0, A, B, 1.0, C0);
      int64_t inexact = 0;
      for (size_t e = 0; e < C.size(); ++e) inexact += double(C[e]) != ref[e];
      CHECK(inexact == 0);
    }

  const float x = 1.0f + 3.0f * std::ldexp(1.0f, -12);
  std::vector<float> X(M * K, x), ones(K * N, 1.0f), Y(M * N);
  kemu::gemm(nullptr, kernel, false, false, M, N, K, 1.0f, X.data(), ones.data(), 0.0f, Y.data());
  const float rounded = static_cast<float>(K) * (1.0f + std::ldexp(1.0f, -10));
  int64_t off = 0;
  for (float y : Y) off += y != rounded;
  CHECK(off == 0);
  std::printf("TF32 GEMM of rows of %.9g by ones, K = %lld: %.9g (rounded inputs: %.9g; truncated: %lld; FP32: %.9g)\n",
              double(x), (long long)K, double(Y[0]), double(rounded), (long long)K, double(K) * x);

  auto G = lcg_data(M * K, 501), H = lcg_data(K * N, 502);
  std::vector<float> Ct(M * N), Cf(M * N);
  kemu::gemm(nullptr, kernel, false, false, M, N, K, 1.0f, G.data(), H.data(), 0.0f, Ct.data());
  kemu::gemm(nullptr, GemmKernel::warptiled, false, false, M, N, K, 1.0f, G.data(), H.data(), 0.0f, Cf.data());
  const std::vector<float> none;
  const auto ref = ref_gemm(false, false, M, N, K, 1.0, G, H, 0.0, none);
  const auto bound = tf32_bound(false, false, M, N, K, 1.0, G, H, 0.0, none);
  // bound / ((K + 2) 2^-11) is sum |a||b| (up to FP32's rounding term): FP32's bound is that times (K + 2) 2^-24.
  double worst_tf32 = 0, worst_fp32 = 0;  // max |C - C_exact| in units of FP32's bound
  for (size_t e = 0; e < ref.size(); ++e) {
    const double fp32_bound = bound[e] * std::ldexp(1.0, -13);
    worst_tf32 = std::max(worst_tf32, std::fabs(double(Ct[e]) - ref[e]) / fp32_bound);
    worst_fp32 = std::max(worst_fp32, std::fabs(double(Cf[e]) - ref[e]) / fp32_bound);
  }
  std::printf("TF32 GEMM %lldx%lldx%lld: max error %.1fx FP32's bound (warptiled, FP32: %.2fx)\n", (long long)M,
              (long long)N, (long long)K, worst_tf32, worst_fp32);
  CHECK(worst_fp32 <= 1.0);
  CHECK(worst_tf32 > 4.0);  // TF32, not FP32: past FP32's bound (22.6x on this data)
  CHECK(outside(ref, Ct, bound, "tf32 vs double") == 0);
}


TEST_CASE("TF32 GEMM: exact on TF32 values, inputs rounded to nearest, less precise than FP32 elsewhere") {
  for (GemmKernel kernel : {GemmKernel::tf32, GemmKernel::mma}) {
    CAPTURE(kernel_name(kernel));
    tf32_signature(kernel);
  }
}

TEST_CASE("M or N = 0 is a no-op; K = 0 gives C = beta * C") {
  std::vector<float> C{1.0f, 2.0f};
  for (GemmKernel kernel : kKernels) {  // C *= 3 once per kernel
    kemu::gemm(nullptr, kernel, false, false, 0, 2, 3, 1.0f, nullptr, nullptr, 0.0f, C.data());
    kemu::gemm(nullptr, kernel, false, false, 1, 2, 0, 1.0f, nullptr, nullptr, 3.0f, C.data());
  }
  float times = 1.0f;
  for (size_t i = 0; i < std::size(kKernels); ++i) times *= 3.0f;
  CHECK(C == std::vector<float>{times, 2.0f * times});
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
  std::map<std::string, int64_t> log;  // a template kernel is logged with its arguments ("k<T>"): under its name
  for (const auto& [name, count] : d2l::cuda_emu::launch_log()) log[name.substr(0, name.find('<'))] += count;
  const char* family[] = {"matmul_kernel1_naive", "matmul_kernel2_tiled", "matmul_kernel3_regblock",
                          "matmul_kernel4_warptiled", "matmul_kernel5_tf32", "matmul_kernel6_mma"};
  int covered = 0;
  for (const char* name : family) covered += log.count(name) == 1 && log.at(name) == 1;
  CHECK(covered == 6);
  CHECK(log.size() == 6);
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
      if (tf32_kernel(kernel))
        REQUIRE(outside(ref_gemm(false, false, n, n, n, 1.0, A, B, 0.0, C), C,
                        tf32_bound(false, false, n, n, n, 1.0, A, B, 0.0, C), "speed check") == 0);
      else
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
