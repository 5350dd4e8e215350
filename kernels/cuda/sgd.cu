// sgd_update: w[i] -= lr * g[i] for i < n (lr already divided by the batch size by the caller).
// The CUDA twin of kernels/cpu/sgd.cpp. Threads: one parameter per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void sgd_update_kernel(float* __restrict__ w, const float* __restrict__ g, int64_t n, float lr) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) w[i] -= lr * g[i];
}

void sgd_update(Stream stream, float* w, const float* g, int64_t n, float lr) {
  D2L_LAUNCH_OVER(n, stream, sgd_update_kernel, w, g, n, lr);
}

}  // namespace D2L_CUDA_NS
