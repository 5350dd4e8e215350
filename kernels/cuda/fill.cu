// fill: x[i] = value;  copy: dst[i] = src[i];  scale: y[i] = alpha * x[i]   (i < n, flat arrays)
// The CUDA twin of kernels/cpu/fill.cpp. Threads: one item per thread per step of a grid-stride
// loop (common.cuh grid_for): thread t of the grid handles i = t, t + gridDim.x * blockDim.x, ...
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void fill_kernel(float* x, int64_t n, float value) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) x[i] = value;
}

// Moves the bits unchanged (loads and stores never convert), so int32 data copies too.
__global__ void copy_kernel(const float* __restrict__ src, float* __restrict__ dst, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dst[i] = src[i];
}

// x and y may be the same array (in-place scaling): no __restrict__.
__global__ void scale_kernel(const float* x, float* y, int64_t n, float alpha) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = alpha * x[i];
}

void fill(Stream stream, float* x, int64_t n, float value) {
  D2L_LAUNCH_OVER(n, stream, fill_kernel, x, n, value);
}

void copy(Stream stream, const float* src, float* dst, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, copy_kernel, src, dst, n);
}

void scale(Stream stream, const float* x, float* y, int64_t n, float alpha) {
  D2L_LAUNCH_OVER(n, stream, scale_kernel, x, y, n, alpha);
}

}  // namespace D2L_CUDA_NS
