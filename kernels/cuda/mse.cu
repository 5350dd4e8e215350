// mse (d2l's squared_loss), elementwise over n: l[i] = (p[i] - t[i])^2 / 2;
// backward: dp[i] = dl[i] * (p[i] - t[i]).
// The CUDA twin of kernels/cpu/mse.cpp. Threads: one element per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void mse_forward_kernel(const float* p, const float* t, float* l, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float d = p[i] - t[i];
    l[i] = 0.5f * d * d;
  }
}

__global__ void mse_backward_kernel(const float* p, const float* t, const float* dl, float* dp, int64_t n) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) dp[i] = dl[i] * (p[i] - t[i]);
}

void mse_forward(Stream stream, const float* p, const float* t, float* l, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, mse_forward_kernel, p, t, l, n);
}

void mse_backward(Stream stream, const float* p, const float* t, const float* dl, float* dp, int64_t n) {
  D2L_LAUNCH_OVER(n, stream, mse_backward_kernel, p, t, dl, dp, n);
}

}  // namespace D2L_CUDA_NS
