// cast: float32 into bfloat16 or float16 bits, rounded to nearest even, and back (exact); flat
// arrays of n. The CUDA twin of kernels/cpu/cast.cpp: CUDA's own conversions (cvt.rn.bf16.f32 and
// cvt.rn.f16.f32 on the GPU; kernels/emu/float16.hpp, the CPU's reference bit for bit, under the
// emulation). Threads: one element per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void cast_to_bf16_kernel(const float* x, uint16_t* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

__global__ void cast_to_f16_kernel(const float* x, uint16_t* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __half_as_ushort(__float2half_rn(x[i]));
}

__global__ void cast_from_bf16_kernel(const uint16_t* x, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __bfloat162float(__ushort_as_bfloat16(x[i]));
}

__global__ void cast_from_f16_kernel(const uint16_t* x, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = __half2float(__ushort_as_half(x[i]));
}

void cast_to_bf16(Stream stream, const float* x, uint16_t* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_to_bf16_kernel, x, y, n);
}

void cast_to_f16(Stream stream, const float* x, uint16_t* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_to_f16_kernel, x, y, n);
}

void cast_from_bf16(Stream stream, const uint16_t* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_from_bf16_kernel, x, y, n);
}

void cast_from_f16(Stream stream, const uint16_t* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_from_f16_kernel, x, y, n);
}

}  // namespace D2L_CUDA_NS
