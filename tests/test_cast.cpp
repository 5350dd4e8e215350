// cast and the 16-bit formats: kernels/cpu/float16.hpp's conversions bit for bit against the nearest
// representable value found by search in a table of every bfloat16 and float16 value (doubles built
// from the formats' definitions), and against the CPU's own F16C instruction where it has one; the
// CPU kernels against those conversions; the emulated CUDA kernels bitwise against the CPU's; the op
// on every device kind, its copies, its errors and its gradient.
#include <doctest/doctest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <immintrin.h>
#include <vector>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"
#include "kernels/cpu/float16.hpp"
#include "one_line_error.hpp"

// float32 rounded to nearest even into bfloat16 or float16 bits, and those bits widened.
D2L_DECLARE_KERNEL(cast_to_bf16, const float* x, uint16_t* y, int64_t n);
D2L_DECLARE_KERNEL(cast_to_f16, const float* x, uint16_t* y, int64_t n);
D2L_DECLARE_KERNEL(cast_from_bf16, const uint16_t* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(cast_from_f16, const uint16_t* x, float* y, int64_t n);

using namespace d2l::test;
using d2l::DType;
using Bits = std::vector<uint16_t>;

namespace {

// ---- the reference: each format's non-negative values by bit pattern (increasing with the
// pattern), from the definitions: bfloat16 = (1 + m / 2^7) 2^(e - 127), subnormal m 2^-133;
// float16 = (1 + m / 2^10) 2^(e - 15), subnormal m 2^-24.
struct Format {
  const char* name;
  int mantissa_bits, bias;
  uint16_t infinity;  // the first pattern past the largest finite number
  double value(uint32_t bits) const {
    const uint32_t e = bits >> mantissa_bits, m = bits & ((1u << mantissa_bits) - 1);
    if (bits == infinity) return std::ldexp(1.0, (1 << (15 - mantissa_bits)) - 1 - bias);  // 2^(emax + 1)
    return e == 0 ? std::ldexp(double(m), 1 - bias - mantissa_bits)
                  : std::ldexp(double((1u << mantissa_bits) + m), int(e) - bias - mantissa_bits);
  }
};
const Format kBf16{"bfloat16", 7, 127, 0x7F80};
const Format kF16{"float16", 10, 15, 0x7C00};

// |x| rounded to the nearest pattern, ties to the even one; infinity stands one step past the
// largest finite number, where an unbounded exponent would put the next value (so values from half a
// step past the largest on become infinity, as IEEE 754 says).
uint16_t nearest(const Format& f, double a) {
  uint32_t lo = 0, hi = f.infinity;  // the first pattern whose value >= a, by bisection
  if (a >= f.value(hi)) return f.infinity;
  while (lo < hi) {
    const uint32_t mid = (lo + hi) / 2;
    if (f.value(mid) >= a) hi = mid;
    else lo = mid + 1;
  }
  if (f.value(hi) == a || hi == 0) return uint16_t(hi);
  const double midpoint = (f.value(hi - 1) + f.value(hi)) / 2;  // exact: two neighbours of 8 or 11 bits
  if (a < midpoint) return uint16_t(hi - 1);
  if (a > midpoint) return uint16_t(hi);
  return uint16_t(hi % 2 == 0 ? hi : hi - 1);
}

uint16_t reference(const Format& f, float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  if (std::isinf(x)) return sign | f.infinity;
  return sign | nearest(f, std::fabs(double(x)));
}

bool is_nan(const Format& f, uint16_t h) { return (h & 0x7FFF) > f.infinity; }

// Every float32 class: all 65,536 upper halves (signs, zeros, subnormals, normals, infinities, NaNs)
// with lower halves at and around the ties of both formats (bfloat16 drops 16 bits, float16 13 and,
// in its subnormal range, up to 24).
std::vector<float> float_classes() {
  const uint32_t lows[] = {0x0000, 0x0001, 0x0FFF, 0x1000, 0x1001, 0x1FFF, 0x2000, 0x3000, 0x4000,
                           0x6000, 0x7FFF, 0x8000, 0x8001, 0xC000, 0xE001, 0xFFFF};
  std::vector<float> v;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : lows) v.push_back(std::bit_cast<float>(hi << 16 | lo));
  return v;
}

template <class Convert>
int count_wrong(const Format& f, const std::vector<float>& xs, Convert convert) {
  int wrong = 0;
  for (float x : xs) {
    const uint16_t got = convert(x);
    const bool ok = std::isnan(x) ? is_nan(f, got) && (got >> 15) == (std::bit_cast<uint32_t>(x) >> 31)
                                  : got == reference(f, x);
    if (!ok && wrong++ < 5)
      std::printf("  %s: %a (0x%08x) gave 0x%04x, the nearest is 0x%04x\n", f.name, double(x), std::bit_cast<uint32_t>(x),
                  unsigned(got), unsigned(std::isnan(x) ? 0 : reference(f, x)));
  }
  return wrong;
}

__attribute__((target("f16c"))) uint16_t f16c_round(float x) { return _cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT); }

}  // namespace

TEST_CASE("the reference tables are the formats") {
  CHECK(kBf16.value(0x3F80) == 1.0);
  CHECK(kBf16.value(0x7F7F) == double(std::bit_cast<float>(0x7F7F0000u)));  // bfloat16's largest
  CHECK(kBf16.value(0x0001) == double(std::bit_cast<float>(0x00010000u)));  // its smallest subnormal
  CHECK(kBf16.value(0x7F80) == std::ldexp(1.0, 128));
  CHECK(kF16.value(0x3C00) == 1.0);
  CHECK(kF16.value(0x7BFF) == 65504.0);
  CHECK(kF16.value(0x0001) == std::ldexp(1.0, -24));
  CHECK(kF16.value(0x0400) == std::ldexp(1.0, -14));
  CHECK(kF16.value(0x7C00) == 65536.0);
  CHECK(nearest(kF16, 65519.0) == 0x7BFF);
  CHECK(nearest(kF16, 65520.0) == 0x7C00);  // the tie past the largest goes to infinity
  CHECK(nearest(kF16, 1.0 + std::ldexp(1.0, -11)) == 0x3C00);              // a tie to even, down
  CHECK(nearest(kF16, 1.0 + 3 * std::ldexp(1.0, -11)) == 0x3C02);          // and up
  CHECK(nearest(kF16, std::ldexp(1.0, -25)) == 0);                         // half the smallest: zero
}

TEST_CASE("narrowing rounds to the nearest value, ties to even, on every float class") {
  const std::vector<float> xs = float_classes();
  CHECK(count_wrong(kBf16, xs, d2l::kernels::cpu::bf16_from_float) == 0);
  CHECK(count_wrong(kF16, xs, d2l::kernels::cpu::f16_from_float) == 0);
}

TEST_CASE("float16 narrowing is the CPU's F16C instruction bit for bit, NaNs included") {
  if (!__builtin_cpu_supports("f16c")) {
    MESSAGE("this CPU has no F16C; skipped");
    return;
  }
  int differ = 0;
  for (float x : float_classes()) differ += d2l::kernels::cpu::f16_from_float(x) != f16c_round(x);
  CHECK(differ == 0);
}

TEST_CASE("widening is exact on every 16-bit pattern") {
  int wrong = 0;
  for (uint32_t h = 0; h < 0x10000; ++h)
    for (const Format* f : {&kBf16, &kF16}) {
      const float got = f == &kBf16 ? d2l::kernels::cpu::float_from_bf16(uint16_t(h)) : d2l::kernels::cpu::float_from_f16(uint16_t(h));
      const uint32_t magnitude = h & 0x7FFF;
      const bool negative = h & 0x8000;
      bool ok;
      if (magnitude > f->infinity) ok = std::isnan(got) && std::signbit(got) == negative;
      else if (magnitude == f->infinity) ok = std::isinf(got) && std::signbit(got) == negative;
      else ok = double(got) == (negative ? -1 : 1) * f->value(magnitude) && std::signbit(got) == negative;
      wrong += !ok;
    }
  CHECK(wrong == 0);
}

// ---- the kernels: the CPU's against the conversions, elementwise; the emulated CUDA kernels bitwise
// against the CPU's, on values of every class (NaN, infinities, subnormals, ties).
namespace {
std::vector<float> mixed_values(int64_t n) {
  const std::vector<float> classes = float_classes();
  std::vector<float> v = lcg_data(n, 31);
  for (int64_t i = 0; i < n; i += 3) v[i] = classes[(static_cast<size_t>(i) * 2654435761u) % classes.size()];
  return v;
}
Bits patterns(int64_t n) {
  Bits b(n);
  for (int64_t i = 0; i < n; ++i) b[i] = uint16_t(i * 40503u);
  return b;
}
}  // namespace

TEST_CASE("the CPU's cast kernels convert every element") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
    const Vec x = mixed_values(n);
    const Bits h = patterns(n);
    Bits bf(n), f16(n);
    Vec wide_bf(n), wide_f16(n);
    cpu::cast_to_bf16(c, x.data(), bf.data(), n);
    cpu::cast_to_f16(c, x.data(), f16.data(), n);
    cpu::cast_from_bf16(c, h.data(), wide_bf.data(), n);
    cpu::cast_from_f16(c, h.data(), wide_f16.data(), n);
    int wrong = 0;
    for (int64_t i = 0; i < n; ++i) {
      wrong += bf[i] != cpu::bf16_from_float(x[i]) || f16[i] != cpu::f16_from_float(x[i]);
      const float b = cpu::float_from_bf16(h[i]), f = cpu::float_from_f16(h[i]);
      wrong += std::memcmp(&wide_bf[i], &b, 4) != 0 || std::memcmp(&wide_f16[i], &f, 4) != 0;
    }
    CHECK(wrong == 0);
  });
}

namespace {
void check_emulated(kemu::Stream s) {
  for (int64_t n : kGridSizes) {
    CAPTURE(n);
    const Vec x = mixed_values(n);
    const Bits h = patterns(n);
    Bits bf(n), f16(n), bf_emu(n), f16_emu(n);
    Vec wide(n), wide_emu(n), wide16(n), wide16_emu(n);
    cpu::cast_to_bf16(cpu::serial_ctx(), x.data(), bf.data(), n);
    cpu::cast_to_f16(cpu::serial_ctx(), x.data(), f16.data(), n);
    cpu::cast_from_bf16(cpu::serial_ctx(), h.data(), wide.data(), n);
    cpu::cast_from_f16(cpu::serial_ctx(), h.data(), wide16.data(), n);
    kemu::cast_to_bf16(s, x.data(), bf_emu.data(), n);
    kemu::cast_to_f16(s, x.data(), f16_emu.data(), n);
    kemu::cast_from_bf16(s, h.data(), wide_emu.data(), n);
    kemu::cast_from_f16(s, h.data(), wide16_emu.data(), n);
    CHECK(same_bits(bf, bf_emu, "cast_to_bf16"));
    CHECK(same_bits(f16, f16_emu, "cast_to_f16"));
    CHECK(same_bits(wide, wide_emu, "cast_from_bf16"));
    CHECK(same_bits(wide16, wide16_emu, "cast_from_f16"));
  }
}
}  // namespace

D2L_EMULATED_CASES("emulated cast is bitwise the CPU's", "emulated cast on 2 device threads", check_emulated)

// ---- the op, on every device kind this machine has: cpu(0), emu(0) and gpu(0) when there is one.
namespace {
std::vector<d2l::Device> devices() {
  std::vector<d2l::Device> d{d2l::cpu(0), d2l::emu(0)};
  if (d2l::num_gpus() > 0) d.push_back(d2l::gpu(0));
  return d;
}
// The values a 16-bit tensor should hold: x through the reference, widened (NaNs compared as NaNs).
Vec through(DType t, const Vec& x) {
  Vec out;
  for (float v : x)
    out.push_back(t == DType::bf16 ? cpu::float_from_bf16(cpu::bf16_from_float(v)) : cpu::float_from_f16(cpu::f16_from_float(v)));
  return out;
}
bool same_values(const Vec& want, const Vec& got) {
  if (want.size() != got.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (std::isnan(want[i]) ? !std::isnan(got[i]) : std::memcmp(&want[i], &got[i], 4) != 0) return false;
  return true;
}
}  // namespace

TEST_CASE("cast on every device: the values, the round trips, bfloat16 to float16, copies") {
  const Vec x = mixed_values(1000);
  for (d2l::Device d : devices()) {
    CAPTURE(d.str());
    d2l::Tensor t = d2l::Tensor::from_vector(x, {10, 100}, d);
    for (DType low : {DType::bf16, DType::f16}) {
      INFO(d2l::dtype_name(low));
      d2l::Tensor h = d2l::cast(t, low);
      CHECK(h.dtype() == low);
      CHECK(h.shape() == d2l::Shape{10, 100});
      CHECK(h.storage()->bytes == 2000);  // two bytes an element
      CHECK(same_values(through(low, x), h.to_vector()));
      d2l::Tensor back = d2l::cast(h, DType::f32);
      CHECK(back.dtype() == DType::f32);
      CHECK(same_values(through(low, x), back.to_vector()));
      CHECK(d2l::cast(h, low).same(h));  // already of that type: the tensor itself
      // Between the 16-bit formats: through float32, one rounding.
      const DType other = low == DType::bf16 ? DType::f16 : DType::bf16;
      CHECK(same_values(through(other, through(low, x)), d2l::cast(h, other).to_vector()));
      // Copies keep the bits: to another device and back, clone.
      d2l::Tensor moved = h.to(d2l::cpu(1)).to(d);
      CHECK(moved.dtype() == low);
      CHECK(same_values(through(low, x), moved.to_vector()));
      CHECK(same_values(through(low, x), h.clone().to_vector()));
    }
  }
}

TEST_CASE("cast refuses what it cannot do, in one line; the other ops refuse 16-bit inputs") {
  d2l::Tensor labels = d2l::Tensor::from_vector(std::vector<int32_t>{1, 2}, {2}, d2l::cpu(0));
  check_one_line_error([&] { d2l::cast(labels, DType::bf16); }, "cast: casts between float32, bfloat16 and float16, not int32 to bfloat16");
  d2l::Tensor x = d2l::Tensor::from_vector(Vec{1, 2}, {2}, d2l::cpu(0));
  check_one_line_error([&] { d2l::cast(x, DType::i32); }, "cast: casts between float32, bfloat16 and float16, not float32 to int32");
  d2l::Tensor h = d2l::cast(x, DType::f16);
  check_one_line_error([&] { d2l::sigmoid(h); }, "sigmoid: every input must be float32");
  check_one_line_error([&] { h.data(); }, "expected a float32 tensor, got float16 (2,)");
  check_one_line_error([&] { x.data16(); }, "expected a bfloat16 or float16 tensor, got float32 (2,)");
  CHECK(h.str().find("[1. 2.]") == 0);
}

// The gradient of a cast is the incoming gradient cast back to the input's type, as PyTorch's .to()
// defines it (a rounding's derivative is 0 almost everywhere: finite differences do not apply, and
// every framework passes the gradient straight through). Through a 16-bit tensor the gradient is
// itself 16-bit, and two of them arriving at one tensor are added in float32 and rounded once.
TEST_CASE("cast's gradient is the incoming one cast back; 16-bit gradients add in float32, rounded once") {
  for (d2l::Device d : devices()) {
    CAPTURE(d.str());
    for (DType low : {DType::bf16, DType::f16}) {
      INFO(d2l::dtype_name(low));
      const Vec xv = lcg_data(50, 5), w1 = lcg_data(50, 6), w2 = lcg_data(50, 7);
      d2l::Tensor x = d2l::Tensor::from_vector(xv, {50}, d);
      x.attach_grad();
      d2l::Tensor a = d2l::Tensor::from_vector(w1, {50}, d), b = d2l::Tensor::from_vector(w2, {50}, d);
      d2l::Tensor h = d2l::cast(x, low);  // used twice below
      d2l::Tensor loss = d2l::sum(d2l::mul(d2l::cast(h, DType::f32), a)) + d2l::sum(d2l::mul(d2l::cast(h, DType::f32), b));
      loss.backward();
      Vec want(50);
      const Vec r1 = through(low, w1), r2 = through(low, w2);
      for (size_t i = 0; i < 50; ++i) want[i] = through(low, {r1[i] + r2[i]})[0];
      CHECK(same_values(want, x.grad().to_vector()));
    }
  }
}
