// adam_update: one step of PyTorch's Adam (torch.optim.Adam, weight decay added to the gradient) over n
// parameters, in place on w, m and v (kernels/cpu/adam.cpp has the formula):
//   gi = grad_scale * g + wd * w;  m = beta1 * m + (1 - beta1) * gi;  v = beta2 * v + (1 - beta2) * gi * gi
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps)),  step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t)
// multi_adam_update: the same step on a list of tensors in one launch (multi_tensor.cuh).
// The CUDA twin of kernels/cpu/adam.cpp.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace D2L_CUDA_NS {

// The step's constants, as the launchers take them.
struct AdamConstants {
  float grad_scale, wd, beta1, beta2, eps, step_size, bc2_sqrt;
};

// Element i's step, written once for both kernels below: the same expression, so the same instructions
// and the same bits whichever kernel runs it.
__device__ __forceinline__ void adam_element(float* w, float* m, float* v, const float* g, int64_t i,
                                             const AdamConstants& k) {
  const float gi = k.grad_scale * g[i] + k.wd * w[i];
  m[i] = k.beta1 * m[i] + (1.0f - k.beta1) * gi;
  v[i] = k.beta2 * v[i] + (1.0f - k.beta2) * gi * gi;
  w[i] -= k.step_size * (m[i] / (sqrtf(v[i]) / k.bc2_sqrt + k.eps));
}

// ---- one tensor (the plain version). Threads: one parameter per thread per grid-stride step.
__global__ void adam_update_kernel(float* __restrict__ w, float* __restrict__ m, float* __restrict__ v,
                                   const float* __restrict__ g, int64_t n, AdamConstants k) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) adam_element(w, m, v, g, i, k);
}

void adam_update(Stream stream, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                 float beta1, float beta2, float eps, float step_size, float bc2_sqrt) {
  const AdamConstants k{grad_scale, wd, beta1, beta2, eps, step_size, bc2_sqrt};
  D2L_LAUNCH_OVER(n, stream, adam_update_kernel, w, m, v, g, n, k);
}

// ---- a list of tensors in one launch (multi_tensor.cuh: the table of w, m, v, g and the chunks).
// Threads: block b updates chunks b, b + gridDim.x, ...; a chunk's elements go one per thread per step.
__global__ void multi_adam_update_kernel(TensorTable<4> table, AdamConstants k) {
  for (int64_t c = blockIdx.x; c < table.chunks; c += gridDim.x) {
    const Chunk ch = chunk_at(table, c);
    const int t = ch.tensor;
    for (int64_t i = ch.begin + threadIdx.x; i < ch.end; i += blockDim.x)
      adam_element(table.ptr[0][t], table.ptr[1][t], table.ptr[2][t], table.ptr[3][t], i, k);
  }
}

void multi_adam_update(Stream stream, float* const* w, float* const* m, float* const* v, const float* const* g,
                       const int64_t* n, int64_t count, float grad_scale, float wd, float beta1, float beta2, float eps,
                       float step_size, float bc2_sqrt) {
  const AdamConstants k{grad_scale, wd, beta1, beta2, eps, step_size, bc2_sqrt};
  // The table holds float* for every list; g is only read.
  for_each_table<4>({w, m, v, const_cast<float* const*>(g)}, n, count, [&](const TensorTable<4>& table, unsigned grid) {
    D2L_LAUNCH(multi_adam_update_kernel, grid, kThreads, 0, stream)(table, k);
    D2L_CHECK_LAUNCH(multi_adam_update_kernel);
  });
}

}  // namespace D2L_CUDA_NS
