// CUDA's 16-bit float types and their conversions (cuda_bf16.h, cuda_fp16.h) for g++: __nv_bfloat16
// and __half as their bits, converted by the CPU's reference (kernels/cpu/float16.hpp), which rounds
// as the GPU's cvt.rn.bf16.f32 and cvt.rn.f16.f32 do; a NaN keeps x86's bits here (a GPU gives its
// canonical NaN). Visible unqualified inside the emulated kernels, as builtins.hpp's names are.
#pragma once
#include <cstdint>

#include "kernels/cpu/float16.hpp"

namespace d2l::cuda_emu::builtins {

struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};

inline __nv_bfloat16 __float2bfloat16_rn(float x) { return {kernels::cpu::bf16_from_float(x)}; }
inline float __bfloat162float(__nv_bfloat16 h) { return kernels::cpu::float_from_bf16(h.bits); }
inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 h) { return h.bits; }
inline __nv_bfloat16 __ushort_as_bfloat16(uint16_t bits) { return {bits}; }

inline __half __float2half_rn(float x) { return {kernels::cpu::f16_from_float(x)}; }
inline float __half2float(__half h) { return kernels::cpu::float_from_f16(h.bits); }
inline uint16_t __half_as_ushort(__half h) { return h.bits; }
inline __half __ushort_as_half(uint16_t bits) { return {bits}; }

}  // namespace d2l::cuda_emu::builtins
