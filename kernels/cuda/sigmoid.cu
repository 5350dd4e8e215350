// sigmoid: y[i] = 1 / (1 + exp(-x[i]));  backward: dx[i] = dy[i] * y[i] * (1 - y[i])   (flat arrays of n)
// The CUDA twin of kernels/cpu/sigmoid.cpp (why exp(-|x|) keeps it stable: see there). expf, not the
// faster __expf: the emulated build then computes the CPU's bits. Threads: one element per thread
// per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void sigmoid_forward_kernel(const float* x, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float t = expf(-fabsf(x[i]));  // in (0, 1]
    y[i] = x[i] >= 0.0f ? 1.0f / (1.0f + t) : t / (1.0f + t);
  }
}

__global__ void sigmoid_backward_kernel(const float* y, const float* dy, float* dx, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = dy[i] * (y[i] * (1.0f - y[i]));
}

void sigmoid_forward(Stream stream, const float* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, sigmoid_forward_kernel, x, y, n);
}

void sigmoid_backward(Stream stream, const float* y, const float* dy, float* dx, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, sigmoid_backward_kernel, y, dy, dx, n);
}

}  // namespace D2L_CUDA_NS
