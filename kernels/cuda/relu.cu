// relu: y[i] = max(x[i], 0);  backward: dx[i] = dy[i] if x[i] > 0 else 0   (flat arrays of n)
// The CUDA twin of kernels/cpu/relu.cpp. Threads: one element per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void relu_forward_kernel(const float* x, float* y, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = x[i] > 0.0f ? x[i] : 0.0f;
}

__global__ void relu_backward_kernel(const float* x, const float* dy, float* dx, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
}

void relu_forward(Stream stream, const float* x, float* y, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, relu_forward_kernel, x, y, n);
}

void relu_backward(Stream stream, const float* x, const float* dy, float* dx, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, relu_backward_kernel, x, dy, dx, n);
}

}  // namespace D2L_CUDA_NS
