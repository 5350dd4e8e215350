// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
// The CUDA twin of kernels/cpu/bias_add.cpp.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

// Threads: one element per thread per grid-stride step; element k = (o * C + c) * inner + i has
// channel c = (k / inner) % C.
__global__ void bias_add_forward_kernel(const float* x, const float* __restrict__ b, float* y, int64_t outer,
                                        int64_t C, int64_t inner) {
  const int64_t n = outer * C * inner, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride)
    y[k] = x[k] + b[k / inner % C];
}

// Threads: one block per channel c (blockIdx.x). The block's threads stride over that channel's
// outer * inner values m = o * inner + i, each summing its share in double; block_sum (reduce.cuh)
// adds the shares in a fixed tree order, so db does not depend on the run.
__global__ void bias_add_backward_kernel(const float* __restrict__ dy, float* __restrict__ db, int64_t outer,
                                         int64_t C, int64_t inner) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = blockIdx.x;
  double s = 0.0;
  for (int64_t m = threadIdx.x; m < outer * inner; m += blockDim.x) {
    const int64_t o = m / inner, i = m % inner;
    s += dy[(o * C + ch) * inner + i];
  }
  s = block_sum(s, warp_sums);
  if (threadIdx.x == 0) db[ch] = static_cast<float>(s);
}

void bias_add_forward(Stream stream, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner) {
  const int64_t n = outer * C * inner;
  D2L_LAUNCH_OVER(n, stream, bias_add_forward_kernel, x, b, y, outer, C, inner);
}

void bias_add_backward(Stream stream, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  if (C <= 0) return;
  D2L_LAUNCH(bias_add_backward_kernel, static_cast<unsigned>(C), kReduceThreads, 0, stream)(dy, db, outer, C, inner);
  D2L_CHECK_LAUNCH(bias_add_backward_kernel);
}

}  // namespace D2L_CUDA_NS
