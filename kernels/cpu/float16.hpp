// The 16-bit floating-point formats and their conversions from and to float32, bit by bit: the
// reference every device kind uses (the CPU's cast kernels, the emulation's __float2bfloat16_rn and
// __float2half_rn, the host's reads of a 16-bit tensor, safetensors' BF16 and F16).
//
//   bfloat16 (Google Brain's "brain float"): sign, 8 exponent bits, 7 mantissa bits. float32's range
//            with 8 bits of precision: a float32 with its low 16 bits rounded away.
//   float16  (IEEE 754 binary16, "half"): sign, 5 exponent bits (bias 15), 10 mantissa bits. Normal
//            numbers from 2^-14 to 65504, subnormals down to 2^-24, 11 bits of precision.
//
// Narrowing rounds to nearest, ties to even (IEEE 754's default, as PyTorch's .to(), CUDA's
// __float2bfloat16_rn / __float2half_rn and x86's VCVTNEPS2BF16 / VCVTPS2PH do):
// - a value beyond the largest finite number by half a unit or more becomes infinity (float16 above
//   65504 from 65520 on; bfloat16 only from 2^128 (1 - 2^-9), where float32's own range ends);
// - float16 keeps subnormal results (down to 2^-24; below 2^-25 a value becomes a signed zero) and
//   bfloat16 keeps float32's subnormals as its own;
// - infinities stay infinities, the sign of zero is kept;
// - a NaN stays a NaN with its sign, made quiet, its payload's top bits kept (x86's rule; a GPU
//   returns its canonical NaN instead: a NaN's bits are not part of what the tests compare there).
// Widening (16 bits to float32) is exact.
#pragma once
#include <bit>
#include <cstdint>

namespace d2l::kernels::cpu {

constexpr uint16_t bf16_from_float(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  // Adding 0x7FFF plus the kept part's lowest bit carries into bit 16 exactly when the dropped half
  // is above one half, or exactly one half and the kept part odd. A carry out of the mantissa moves
  // to the next binade, and out of the largest finite number to infinity, as rounding must.
  const uint32_t rounded = (x + 0x7FFFu + ((x >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (x >> 16) | 0x0040u;  // a NaN: its top bits, made quiet
  // A select, not a branch: loops of conversions vectorise.
  return static_cast<uint16_t>((x & 0x7FFFFFFFu) > 0x7F800000u ? quiet_nan : rounded);
}

constexpr float float_from_bf16(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

constexpr uint16_t f16_from_float(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t a = x & 0x7FFFFFFFu;  // |f|
  if (a > 0x7F800000u) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN: quiet
  if (a >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520 (and infinity): infinity
  if (a < 0x38800000u) {  // below 2^-14: a subnormal result m * 2^-24, m = |f| * 2^24 rounded
    if (a <= 0x33000000u) return static_cast<uint16_t>(sign);  // <= 2^-25: zero (2^-25 is a tie, 0 is even)
    const uint32_t e = a >> 23;                                // float32's biased exponent, 102..112
    const uint32_t mantissa = (a & 0x7FFFFFu) | 0x800000u;     // with its leading 1
    const uint32_t shift = 126u - e;                           // |f| * 2^24 = mantissa >> shift
    uint32_t m = mantissa >> shift;
    const uint32_t rest = mantissa & ((1u << shift) - 1u), half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (m & 1u))) ++m;        // m = 0x400 is the smallest normal
    return static_cast<uint16_t>(sign | m);
  }
  // A normal result: the exponent rebiased from 127 to 15, 13 mantissa bits rounded away (a carry
  // into the exponent is the next binade; 65520 and above were handled).
  uint32_t h = (a - 0x38000000u) >> 13;
  const uint32_t rest = a & 0x1FFFu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

constexpr float float_from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  int32_t e = (h >> 10) & 0x1F;
  uint32_t m = h & 0x3FFu;
  if (e == 0x1F) return std::bit_cast<float>(sign | 0x7F800000u | (m << 13));  // infinity or NaN
  if (e == 0) {
    if (m == 0) return std::bit_cast<float>(sign);  // a signed zero
    e = 1;  // a subnormal m * 2^-24: normalised into float32's normal range
    while (!(m & 0x400u)) m <<= 1, --e;
    m &= 0x3FFu;
  }
  return std::bit_cast<float>(sign | (static_cast<uint32_t>(e + 112) << 23) | (m << 13));
}

// Which 16-bit format a kernel's uint16_t values are in (the 16-bit GEMMs take either).
enum class Float16 { bf16, f16 };
constexpr float widen(Float16 f, uint16_t h) { return f == Float16::bf16 ? float_from_bf16(h) : float_from_f16(h); }
constexpr uint16_t narrow(Float16 f, float x) { return f == Float16::bf16 ? bf16_from_float(x) : f16_from_float(x); }

// The element types a kernel is written once over, as a template parameter V: V::T is what memory
// holds, V::get reads an element as float32 (exactly), V::put writes a float32 result (float32 as it
// is; a 16-bit format rounded to nearest even, once). The 16-bit activations of autocast's
// input-type ops (ReLU, add, max-pooling, BatchNorm's input and output) use them.
struct AsF32 {
  using T = float;
  static constexpr float get(float x) { return x; }
  static constexpr float put(float x) { return x; }
};
template <Float16 F>
struct As16 {
  using T = uint16_t;
  static constexpr float get(uint16_t h) { return widen(F, h); }
  static constexpr uint16_t put(float x) { return narrow(F, x); }
};

}  // namespace d2l::kernels::cpu
