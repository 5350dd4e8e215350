// adam_update: one step of PyTorch's Adam (torch.optim.Adam, weight decay added to the gradient) over n
// parameters, in place on w, m and v (kernels/cpu/adam.cpp has the formula):
//   gi = grad_scale * g + wd * w;  m = beta1 * m + (1 - beta1) * gi;  v = beta2 * v + (1 - beta2) * gi * gi
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)),  step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)
// The CUDA twin of kernels/cpu/adam.cpp. Threads: one parameter per thread per grid-stride step.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

namespace D2L_CUDA_NS {

__global__ void adam_update_kernel(float* __restrict__ w, float* __restrict__ m, float* __restrict__ v,
                                   const float* __restrict__ g, int64_t n, float grad_scale, float wd, float beta1,
                                   float beta2, float eps, float step_size, float bc2_sqrt) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float gi = grad_scale * g[i] + wd * w[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
    v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    w[i] -= step_size * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
  }
}

void adam_update(Stream stream, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                 float beta1, float beta2, float eps, float step_size, float bc2_sqrt) {
  D2L_LAUNCH_OVER(n, stream, adam_update_kernel, w, m, v, g, n, grad_scale, wd, beta1, beta2, eps, step_size, bc2_sqrt);
}

}  // namespace D2L_CUDA_NS
