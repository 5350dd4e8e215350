// The 16-bit GEMMs (kernels/cpu/gemm16.cpp, gemm16_dpbf16.cpp, kernels/cuda/matmul16.cu) and the CPU's
// 16-bit convolution (conv2d16_*) against a double-precision product of the same 16-bit values, within
// float32's summation bound; and matmul on bfloat16 and
// float16 tensors on every device kind, forward and backward, within the 16-bit result's rounding.
#include <doctest/doctest.h>

#include <cmath>
#include <bit>
#include <cstdio>
#include <tuple>
#include <vector>

#include "check.hpp"
#include "core/ops/op.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/kernels.hpp"
#include "one_line_error.hpp"

namespace cpu = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
using cpu::Float16;
using Bits = std::vector<uint16_t>;

namespace {

uint16_t round16(Float16 f, float x) { return f == Float16::bf16 ? cpu::bf16_from_float(x) : cpu::f16_from_float(x); }

// n 16-bit values of magnitude about `scale`, from the test LCG.
Bits values16(Float16 f, int64_t n, uint32_t seed, float scale = 1.0f) {
  Bits b;
  for (float v : d2l::test::lcg_data(n, seed)) b.push_back(round16(f, v * scale));
  return b;
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
};
const Case kCases[] = {{false, false, 1, 1, 1, 1, 0},    {false, false, 7, 5, 33, 1, 0}, {true, false, 33, 17, 70, 1, 0},
                       {false, true, 20, 40, 19, 0.5f, 2}, {true, true, 16, 16, 16, 1, 1},  {false, false, 70, 3, 257, 1, 0},
                       {false, false, 3, 2, 0, 1, 0.5f}};

// Checks C against alpha * op(A) @ op(B) + beta * C0 computed in double from the widened values:
// float32 sums of exact products are within K 2^-24 sum_k |a_ik b_kj| of it (plus the rounding of the
// scaling and of beta C0). Prints the first few misses.
bool within_float32_sums(const Case& c, Float16 f, const Bits& A, const Bits& B, const std::vector<float>& C0,
                         const std::vector<float>& C, const char* what) {
  int bad = 0;
  for (int64_t i = 0; i < c.M; ++i)
    for (int64_t j = 0; j < c.N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < c.K; ++k) {
        const double a = cpu::widen(f, c.ta ? A[k * c.M + i] : A[i * c.K + k]);
        const double b = cpu::widen(f, c.tb ? B[j * c.K + k] : B[k * c.N + j]);
        s += a * b, mag += std::fabs(a * b);
      }
      const double c0 = C0[i * c.N + j], want = c.alpha * s + c.beta * c0;
      const double bound = (c.K + 2) * std::ldexp(1.0, -24) * (std::fabs(c.alpha) * mag + std::fabs(c.beta * c0)) + 1e-30;
      if (!(std::fabs(C[i * c.N + j] - want) <= bound) && bad++ < 5)
        std::printf("  %s: C[%lld][%lld] = %.9g, want %.9g within %.3g\n", what, (long long)i, (long long)j,
                    double(C[i * c.N + j]), want, bound);
    }
  return bad == 0;
}

template <class Gemm>
void check_member(const char* what, Gemm gemm, std::vector<Float16> formats = {Float16::bf16, Float16::f16},
                  std::vector<Case> cases = {std::begin(kCases), std::end(kCases)}) {
  for (Float16 f : formats)
    for (const Case& c : cases) {
      INFO(what);
      INFO((f == Float16::bf16 ? "bfloat16" : "float16"));
      INFO("M " << c.M << " N " << c.N << " K " << c.K << " ta " << c.ta << " tb " << c.tb);
      const Bits A = values16(f, c.M * c.K, 3), B = values16(f, c.K * c.N, 4);
      const std::vector<float> C0 = d2l::test::lcg_data(c.M * c.N, 5);
      std::vector<float> C = C0;
      gemm(f, c, A, B, C);
      CHECK(within_float32_sums(c, f, A, B, C0, C, what));
    }
}

}  // namespace

TEST_CASE("the CPU's 16-bit GEMMs: float32 sums of the exact products") {
  check_member("gemm16_naive", [](Float16 f, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
    cpu::gemm16_naive(cpu::serial_ctx(), f, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
  });
  check_member("gemm16_widened", [](Float16 f, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
    cpu::gemm16_widened(cpu::serial_ctx(), f, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
  });
  check_member("gemm16", [](Float16 f, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
    cpu::gemm16(cpu::serial_ctx(), f, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
  });
}

TEST_CASE("gemm16_dpbf16, VDPBF16PS's member: float32 sums of the exact products, with the instruction and without") {
  for (bool hw : {false, true}) {
    if (hw && !cpu::has_avx512_bf16()) {
      MESSAGE("this CPU has no AVX512-BF16: the member ran its lanes only");
      continue;
    }
    check_member(hw ? "gemm16_dpbf16 (VDPBF16PS)" : "gemm16_dpbf16 (dpbf16_lane)",
                 [hw](Float16, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
                   cpu::gemm16_dpbf16(cpu::serial_ctx(), hw, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(),
                                      c.beta, C.data());
                 },
                 {Float16::bf16});
  }
}

// dpbf16_lane against the instruction, through the member: values of every class (normal ones of
// 2^-60 to 2^60, subnormals, zeros, infinities, NaNs, raw bit patterns), where the order of the two
// products, rounding and the flushing of subnormals all show. NaNs compare as NaNs (their payloads are
// not part of the definition).
// Where the product order and the flushing decide, on every CPU. At 2^24 (a unit of 2) with products
// +1 (high halves) and -1 (low): the high first gives 2^24 + 1 -> 2^24 (a tie, to even), then 2^24 - 1;
// the low first would give 2^24 - 1, then 2^24. And a subnormal product (2^-140) becomes zero.
TEST_CASE("dpbf16_lane: the high halves' product first, a subnormal product flushed to zero") {
  auto pair = [](float high, float low) { return uint32_t{cpu::bf16_from_float(high)} << 16 | cpu::bf16_from_float(low); };
  CHECK(cpu::dpbf16_lane(std::ldexp(1.0f, 24), pair(1, -1), pair(1, 1)) == std::ldexp(1.0f, 24) - 1);
  CHECK(cpu::dpbf16_lane(0.0f, pair(0, std::ldexp(1.0f, -70)), pair(0, std::ldexp(1.0f, -70))) == 0.0f);
}

TEST_CASE("dpbf16_lane computes what VDPBF16PS computes, bit for bit, on values of every class") {
  if (!cpu::has_avx512_bf16()) {
    MESSAGE("this CPU has no AVX512-BF16: nothing to compare dpbf16_lane with");
    return;
  }
  uint32_t state = 12345;
  auto next = [&state] { return state = state * 1664525u + 1013904223u; };
  auto value = [&](bool special) -> uint16_t {
    const uint32_t r = next() >> 8;
    if (r % 8 == 0) return static_cast<uint16_t>(next() & 0x807Fu);  // subnormal (or zero)
    if (special && r % 8 == 1) return static_cast<uint16_t>((next() & 0x8000u) | 0x7F80u);  // infinity
    if (special && r % 8 == 2) return static_cast<uint16_t>(next() >> 16);  // any bits, NaNs too
    return cpu::bf16_from_float(std::ldexp(static_cast<float>(next() >> 8) / 16777216.0f - 0.5f, static_cast<int>(next() % 121) - 60));
  };
  for (auto [M, N, K, ta, tb] : {std::tuple{9, 50, 7, false, false}, {16, 48, 300, true, true}, {5, 3, 64, false, true}}) {
    CAPTURE(M);
    CAPTURE(N);
    CAPTURE(K);
    Bits A(M * K), B(K * N);
    for (int64_t i = 0; i < M * K; ++i) A[i] = value(i % M == 0);  // infinities and NaNs in a few rows or columns only
    for (auto& b : B) b = value(false);
    std::vector<float> C0(M * N);
    for (auto& c : C0) c = std::ldexp(static_cast<float>(next() >> 8) / 16777216.0f - 0.5f, static_cast<int>(next() % 300) - 150);
    std::vector<float> hw = C0, lanes = C0;
    cpu::gemm16_dpbf16(cpu::serial_ctx(), true, ta, tb, M, N, K, 1.0f, A.data(), B.data(), 1.0f, hw.data());
    cpu::gemm16_dpbf16(cpu::serial_ctx(), false, ta, tb, M, N, K, 1.0f, A.data(), B.data(), 1.0f, lanes.data());
    int differ = 0, nans = 0;
    for (size_t i = 0; i < hw.size(); ++i) {
      nans += std::isnan(hw[i]);
      const bool same = (std::isnan(hw[i]) && std::isnan(lanes[i])) ||
                        std::bit_cast<uint32_t>(hw[i]) == std::bit_cast<uint32_t>(lanes[i]);
      if (!same && differ++ < 5) std::printf("  C[%zu]: VDPBF16PS %a, dpbf16_lane %a\n", i, double(hw[i]), double(lanes[i]));
    }
    CHECK(differ == 0);
    CHECK(nans <= static_cast<int>(hw.size()) / 2);  // most values not lost to a NaN: the sums were compared
  }
}

TEST_CASE("the check tells float16 read as bfloat16 from the right product") {
  const Case c{false, false, 5, 6, 7, 1, 0};
  const Bits A = values16(Float16::f16, 35, 3), B = values16(Float16::f16, 42, 4);
  std::vector<float> C0(30, 0.0f), C(30);
  cpu::gemm16_naive(cpu::serial_ctx(), Float16::bf16, false, false, 5, 6, 7, 1, A.data(), B.data(), 0, C.data());
  CHECK_FALSE(within_float32_sums(c, Float16::f16, A, B, C0, C, "wrong format (expected to fail)"));
}

TEST_CASE("gemm16 gives the same bits on one thread and on two") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx two{2, &pool};
  const Bits A = values16(Float16::bf16, 96 * 80, 7), B = values16(Float16::bf16, 80 * 64, 8);
  std::vector<float> one(96 * 64), both(96 * 64);
  cpu::gemm16(cpu::serial_ctx(), Float16::bf16, false, true, 96, 64, 80, 1, A.data(), B.data(), 0, one.data());
  cpu::gemm16(two, Float16::bf16, false, true, 96, 64, 80, 1, A.data(), B.data(), 0, both.data());
  CHECK(one == both);
}

// ---- conv2d's three passes on 16-bit operands (kernels/cpu/conv2d.cpp's conv2d16_*): against the
// definition's sums in double over the same 16-bit values, within float32's summation bound (each output
// sums `terms` exact products, in chunks and partial sums, with at most terms + 2 roundings).
namespace {

struct ConvCase {
  int64_t N, C, H, W, OC, KH, KW, stride, pad;
};

bool conv_within(const std::vector<double>& want, const std::vector<double>& mag, const std::vector<float>& got,
                 int64_t terms, const char* what) {
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double bound = double(terms + 2) * std::ldexp(1.0, -24) * mag[i] + 1e-30;
    if (!(std::fabs(got[i] - want[i]) <= bound) && bad++ < 5)
      std::printf("  %s[%zu] = %.9g, want %.9g within %.3g\n", what, i, double(got[i]), want[i], bound);
  }
  return bad == 0;
}
// The same for a result rounded once into the 16-bit format f: the float32 sum's bound, plus half a
// unit in the last place of the format (2^-8 relative for bfloat16, 2^-11 for float16; 2^-25 absolute
// below float16's normal range).
bool conv_within(const std::vector<double>& want, const std::vector<double>& mag, Float16 f, const Bits& got,
                 int64_t terms, const char* what) {
  const double u = f == Float16::bf16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
  const double tiny = f == Float16::bf16 ? 0 : std::ldexp(1.0, -25);
  int bad = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double sum_bound = double(terms + 2) * std::ldexp(1.0, -24) * mag[i];
    const double bound = u * (std::fabs(want[i]) + sum_bound) + sum_bound + tiny + 1e-30;
    const double g = cpu::widen(f, got[i]);
    if (!(std::fabs(g - want[i]) <= bound) && bad++ < 5)
      std::printf("  %s[%zu] = %.9g, want %.9g within %.3g\n", what, i, g, want[i], bound);
  }
  return bad == 0;
}

}  // namespace

TEST_CASE("conv2d16: forward, backward-data and backward-weight on 16-bit operands, float32 sums of the exact products"
          " (y and dx rounded once into 16 bits)") {
  // 3x3 padded, stride 2, 1x1, and 16 images of 4x4 (chunks of 2 images side by side in one GEMM).
  for (const ConvCase& k : {ConvCase{2, 3, 7, 6, 5, 3, 3, 1, 1}, ConvCase{3, 4, 9, 9, 6, 3, 3, 2, 1},
                            ConvCase{2, 8, 5, 5, 16, 1, 1, 1, 0}, ConvCase{16, 4, 4, 4, 8, 3, 3, 1, 1}})
    for (Float16 f : {Float16::bf16, Float16::f16}) {
      const cpu::Conv2dShape s{k.N, k.C, k.H, k.W, k.OC, k.KH, k.KW, k.stride, k.stride, k.pad, k.pad};
      const int64_t OH = s.OH(), OW = s.OW();
      INFO("N " << k.N << " C " << k.C << " H " << k.H << " OC " << k.OC << " KH " << k.KH << " stride " << k.stride);
      INFO((f == Float16::bf16 ? "bfloat16" : "float16"));
      const Bits x = values16(f, k.N * k.C * k.H * k.W, 21), w = values16(f, k.OC * k.C * k.KH * k.KW, 22),
                 dy = values16(f, k.N * k.OC * OH * OW, 23);
      std::vector<double> y_want(dy.size()), y_mag(dy.size()), dx_want(x.size()), dx_mag(x.size()), dw_want(w.size()),
          dw_mag(w.size());
      for (int64_t n = 0; n < k.N; ++n)
        for (int64_t oc = 0; oc < k.OC; ++oc)
          for (int64_t oh = 0; oh < OH; ++oh)
            for (int64_t ow = 0; ow < OW; ++ow)
              for (int64_t c = 0; c < k.C; ++c)
                for (int64_t kh = 0; kh < k.KH; ++kh)
                  for (int64_t kw = 0; kw < k.KW; ++kw) {
                    const int64_t ih = oh * k.stride - k.pad + kh, iw = ow * k.stride - k.pad + kw;
                    if (ih < 0 || ih >= k.H || iw < 0 || iw >= k.W) continue;
                    const int64_t xi = ((n * k.C + c) * k.H + ih) * k.W + iw, wi = ((oc * k.C + c) * k.KH + kh) * k.KW + kw,
                                  yi = ((n * k.OC + oc) * OH + oh) * OW + ow;
                    const double xv = cpu::widen(f, x[xi]), wv = cpu::widen(f, w[wi]), gv = cpu::widen(f, dy[yi]);
                    y_want[yi] += xv * wv, y_mag[yi] += std::fabs(xv * wv);
                    dx_want[xi] += gv * wv, dx_mag[xi] += std::fabs(gv * wv);
                    dw_want[wi] += gv * xv, dw_mag[wi] += std::fabs(gv * xv);
                  }
      Bits y(dy.size()), dx(x.size());
      std::vector<float> dw(w.size());
      cpu::conv2d16_forward(cpu::serial_ctx(), f, s, x.data(), w.data(), y.data());
      cpu::conv2d16_backward_data(cpu::serial_ctx(), f, s, dy.data(), w.data(), dx.data());
      cpu::conv2d16_backward_weight(cpu::serial_ctx(), f, s, x.data(), dy.data(), dw.data());
      CHECK(conv_within(y_want, y_mag, f, y, k.C * k.KH * k.KW, "y"));
      CHECK(conv_within(dx_want, dx_mag, f, dx, k.OC * k.KH * k.KW, "dx"));
      CHECK(conv_within(dw_want, dw_mag, dw, k.N * OH * OW, "dw"));
    }
}

TEST_CASE("the emulated 16-bit GEMM (kernels/cuda/matmul16.cu): float32 sums of the exact products") {
  check_member("emulated gemm16", [](Float16 f, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
    kemu::gemm16(nullptr, kemu::GemmKernel::tiled, f, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
  });
}

// kernel6 on the tensor cores (kernels/cuda/matmul_mma.cu, emulated: ldmatrix and mma.sync m16n8k16
// exchange the lanes' registers as PTX lays them out). Besides the small cases: several 128 x 128
// block tiles with ragged edges, K over several 32-deep slices, and each operand copied both ways
// (16-byte cp.async where k is contiguous and K % 8 == 0, single elements otherwise).
TEST_CASE("GPU kernel6 mma 16-bit GEMM (emulated): float32 sums of the exact products, block edges, both copies") {
  std::vector<Case> cases{std::begin(kCases), std::end(kCases)};
  cases.push_back({false, true, 130, 136, 72, 1, 0});      // both operands by 16-byte copies
  cases.push_back({false, false, 129, 70, 40, 1, 0.5f});   // op(A) by 16 bytes, op(B) element by element
  cases.push_back({true, true, 64, 260, 33, 2, 0});        // K % 8 != 0: every copy element by element
  cases.push_back({true, false, 200, 9, 96, 1, 1});
  check_member("emulated gemm16 kernel6 (mma)", [](Float16 f, const Case& c, const Bits& A, const Bits& B, std::vector<float>& C) {
    kemu::gemm16(nullptr, kemu::GemmKernel::mma, f, c.ta, c.tb, c.M, c.N, c.K, c.alpha, A.data(), B.data(), c.beta, C.data());
  }, {Float16::bf16, Float16::f16}, cases);
}

// ---- matmul on 16-bit tensors: float32 sums rounded once into the operands' type. Against the
// double product: within half a unit of the 16-bit result (2^-8 relative for bfloat16, 2^-11 for
// float16) plus float32's summation bound. On cpu(0), emu(0) with the library choice (the CPU's
// gemm16) and with the hand-written kernels (--gemm tiled: kernel2; --gemm mma: kernel6 on the tensor
// cores), and gpu(0) where there is one (cuBLAS's cublasGemmEx, kernel2, kernel6).
namespace {

struct Run {
  d2l::Device device;
  const char* gemm;
};

std::vector<Run> runs() {
  std::vector<Run> r{{d2l::cpu(0), "auto"}, {d2l::emu(0), "auto"}, {d2l::emu(0), "tiled"}, {d2l::emu(0), "mma"}};
  if (d2l::num_gpus() > 0)
    r.push_back({d2l::gpu(0), "auto"}), r.push_back({d2l::gpu(0), "tiled"}), r.push_back({d2l::gpu(0), "mma"});
  return r;
}

// y (M, N) against op(a) @ op(b) in double, a and b given as floats (16-bit values widened).
bool product_ok(d2l::DType t, const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& y,
                bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  const double half_unit = std::ldexp(1.0, t == d2l::DType::bf16 ? -8 : -11);
  int bad = 0;
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double s = 0, mag = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(ta ? a[k * M + i] : a[i * K + k]) * (tb ? b[j * K + k] : b[k * N + j]);
        s += p, mag += std::fabs(p);
      }
      const double bound = half_unit * std::fabs(s) + (K + 1) * std::ldexp(1.0, -24) * mag * (1 + half_unit) + 1e-30;
      if (!(std::fabs(y[i * N + j] - s) <= bound) && bad++ < 5)
        std::printf("  y[%lld][%lld] = %.9g, want %.9g within %.3g\n", (long long)i, (long long)j, double(y[i * N + j]),
                    s, bound);
    }
  return bad == 0;
}

std::vector<float> transpose(const std::vector<float>& x, int64_t rows, int64_t cols) {
  std::vector<float> t(x.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) t[c * rows + r] = x[r * cols + c];
  return t;
}

}  // namespace

TEST_CASE("matmul on bfloat16 and float16 tensors, forward and backward, on every device kind") {
  const int64_t M = 9, K = 40, N = 7;
  for (const Run& run : runs()) {
    d2l::detail::set_gemm(run.gemm);
    for (d2l::DType t : {d2l::DType::bf16, d2l::DType::f16}) {
      CAPTURE(run.device.str());
      INFO(run.gemm);
      INFO(d2l::dtype_name(t));
      d2l::Tensor a32 = d2l::Tensor::from_vector(d2l::test::lcg_data(M * K, 11), {M, K}, run.device);
      d2l::Tensor b32 = d2l::Tensor::from_vector(d2l::test::lcg_data(K * N, 12), {K, N}, run.device);
      a32.attach_grad(), b32.attach_grad();
      d2l::Tensor a = d2l::cast(a32, t), b = d2l::cast(b32, t);
      d2l::Tensor y = d2l::matmul(a, b);
      CHECK(y.dtype() == t);
      const std::vector<float> av = a.to_vector(), bv = b.to_vector(), yv = y.to_vector();
      CHECK(product_ok(t, av, bv, yv, false, false, M, N, K));
      // Backward: loss = sum(y * w); the gradient of y is w in y's type, so a's is w16 @ b^T and b's a^T @ w16.
      const std::vector<float> w = d2l::test::lcg_data(M * N, 13);
      d2l::Tensor wt = d2l::Tensor::from_vector(w, {M, N}, run.device);
      d2l::sum(d2l::mul(d2l::cast(y, d2l::DType::f32), wt)).backward();
      const std::vector<float> w16 = d2l::cast(wt, t).to_vector();
      // a's gradient is rounded to t by the matmul, then once more by the cast back: the same value.
      CHECK(product_ok(t, w16, bv, a32.grad().to_vector(), false, true, M, K, N));
      CHECK(product_ok(t, av, w16, b32.grad().to_vector(), true, false, K, N, M));
      // A transposed product against the same reference.
      CHECK(product_ok(t, transpose(av, M, K), bv, d2l::matmul(d2l::cast(d2l::Tensor::from_vector(transpose(av, M, K), {K, M}, run.device), t), b, true, false).to_vector(),
                       true, false, M, N, K));
    }
  }
  d2l::detail::set_gemm("auto");
}

TEST_CASE("matmul refuses operands of two types, in one line") {
  d2l::Tensor a = d2l::Tensor::from_vector(std::vector<float>(6, 1.0f), {2, 3}, d2l::cpu(0));
  d2l::Tensor b = d2l::cast(d2l::Tensor::from_vector(std::vector<float>(6, 1.0f), {3, 2}, d2l::cpu(0)), d2l::DType::bf16);
  d2l::test::check_one_line_error([&] { d2l::matmul(a, b); },
                                  "matmul: a is float32 and b bfloat16: cast one to the other's type first");
  d2l::Tensor labels = d2l::Tensor::from_vector(std::vector<int32_t>(6, 1), {3, 2}, d2l::cpu(0));
  d2l::test::check_one_line_error([&] { d2l::matmul(a, labels); }, "matmul: a and b must be float32, bfloat16 or float16");
}
