// sgd_update: w[i] -= lr * g[i] for i < n (lr already divided by the batch size by the caller).
// multi_sgd_mom_update: MXNet's SGD with momentum and weight decay on a list of tensors in one launch
// (kernels/cpu/sgd.cpp has the formula). The CUDA twin of kernels/cpu/sgd.cpp.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/multi_tensor.cuh"

namespace D2L_CUDA_NS {

// ---- the book's sgd. Threads: one parameter per thread per grid-stride step.
__global__ void sgd_update_kernel(float* __restrict__ w, const float* __restrict__ g, int64_t n, float lr) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) w[i] -= lr * g[i];
}

void sgd_update(Stream stream, float* w, const float* g, int64_t n, float lr) {
  D2L_LAUNCH_OVER(n, stream, sgd_update_kernel, w, g, n, lr);
}

// ---- the Trainer's SGD on every parameter of a device at once (multi_tensor.cuh: the table, the chunks).
// The plain version is the per-tensor step, four kernels per parameter (core/optim/kvstore.cpp sgd_step):
//   scale_(mom, momentum); add_(mom, w, decay); add_(mom, g, grad_scale); add_(w, mom, 1)
// This kernel does the same four operations on each element, each result rounded to float as each of
// those kernels stores it, and each add as axpy_kernel computes it (axpy_value): the same bits.
// Threads: block b updates chunks b, b + gridDim.x, ...; a chunk's elements go one per thread per step.
__global__ void multi_sgd_mom_update_kernel(TensorTable<3> table, float momentum, float decay, float grad_scale) {
  for (int64_t c = blockIdx.x; c < table.chunks; c += gridDim.x) {
    const Chunk k = chunk_at(table, c);
    float* w = table.ptr[0][k.tensor];
    float* mom = table.ptr[1][k.tensor];
    const float* g = table.ptr[2][k.tensor];
    for (int64_t i = k.begin + threadIdx.x; i < k.end; i += blockDim.x) {
      float m = momentum * mom[i];          // scale_(mom, momentum)
      m = axpy_value(decay, w[i], m);       // add_(mom, w, decay): decay = -lr * wd
      m = axpy_value(grad_scale, g[i], m);  // add_(mom, g, grad_scale): grad_scale = -lr / batch_size
      mom[i] = m;
      w[i] = axpy_value(1.0f, m, w[i]);     // add_(w, mom, 1)
    }
  }
}

void multi_sgd_mom_update(Stream stream, float* const* w, float* const* mom, const float* const* g, const int64_t* n,
                          int64_t count, float momentum, float decay, float grad_scale) {
  // The table holds float* for every list; g is only read.
  for_each_table<3>({w, mom, const_cast<float* const*>(g)}, n, count, [&](const TensorTable<3>& table, unsigned grid) {
    D2L_LAUNCH(multi_sgd_mom_update_kernel, grid, kThreads, 0, stream)(table, momentum, decay, grad_scale);
    D2L_CHECK_LAUNCH(multi_sgd_mom_update_kernel);
  });
}

}  // namespace D2L_CUDA_NS
