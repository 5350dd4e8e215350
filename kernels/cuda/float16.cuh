// The conversions between float32 and the 16-bit formats as types, for kernels that take one as a
// template argument (cast.cu, matmul16.cu): Convert()(x) with Convert::From and Convert::To. CUDA's
// own intrinsics (cvt.rn.bf16.f32, cvt.rn.f16.f32 on the GPU; kernels/emu/float16.hpp under the
// emulation).
#pragma once
#include <cstdint>

namespace D2L_CUDA_NS {

struct ToBf16 {
  using From = float;
  using To = uint16_t;
  __device__ uint16_t operator()(float x) const { return __bfloat16_as_ushort(__float2bfloat16_rn(x)); }
};
struct ToF16 {
  using From = float;
  using To = uint16_t;
  __device__ uint16_t operator()(float x) const { return __half_as_ushort(__float2half_rn(x)); }
};
struct FromBf16 {
  using From = uint16_t;
  using To = float;
  __device__ float operator()(uint16_t x) const { return __bfloat162float(__ushort_as_bfloat16(x)); }
};
struct FromF16 {
  using From = uint16_t;
  using To = float;
  __device__ float operator()(uint16_t x) const { return __half2float(__ushort_as_half(x)); }
};

}  // namespace D2L_CUDA_NS
