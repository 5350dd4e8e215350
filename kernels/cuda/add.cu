// add: y = a + b;  axpy: y += alpha * x;  mul: y = a * b   (elementwise over n floats)
// The CUDA twin of kernels/cpu/add.cpp. Threads: one element per thread per grid-stride step.
// No __restrict__: y may be a or b (in-place add).
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void add_kernel(const float* a, const float* b, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = a[i] + b[i];
}

// y += alpha * x, one FMA on a GPU (axpy_value, common.cuh: written once for the kernels that must match it).
__global__ void axpy_kernel(float alpha, const float* x, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = axpy_value(alpha, x[i], y[i]);
}

__global__ void mul_kernel(const float* a, const float* b, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) y[i] = a[i] * b[i];
}

void add(Stream stream, const float* a, const float* b, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, add_kernel, a, b, y, n);
}

void axpy(Stream stream, float alpha, const float* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, axpy_kernel, alpha, x, y, n);
}

void mul(Stream stream, const float* a, const float* b, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, mul_kernel, a, b, y, n);
}

}  // namespace D2L_CUDA_NS
