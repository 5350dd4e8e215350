// cast: float32 into bfloat16 or float16 bits, rounded to nearest even, and back (exact); flat
// arrays of n. The CUDA twin of kernels/cpu/cast.cpp, with CUDA's own conversions (float16.cuh).
// Threads: one element per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/float16.cuh"

namespace D2L_CUDA_NS {

template <class Convert>
__global__ void cast_kernel(const typename Convert::From* x, typename Convert::To* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = Convert()(x[i]);
}

void cast_to_bf16(Stream stream, const float* x, uint16_t* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_kernel<ToBf16>, x, y, n);
}

void cast_to_f16(Stream stream, const float* x, uint16_t* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_kernel<ToF16>, x, y, n);
}

void cast_from_bf16(Stream stream, const uint16_t* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_kernel<FromBf16>, x, y, n);
}

void cast_from_f16(Stream stream, const uint16_t* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, cast_kernel<FromF16>, x, y, n);
}

}  // namespace D2L_CUDA_NS
