// argmax: x (N, K) -> idx (N) int32, the first index of each row's maximum.
// count_correct: correct[0] = (float) #{i : argmax(x[i]) == labels[i]}.
// The CUDA twin of kernels/cpu/argmax.cpp.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

__device__ __forceinline__ int32_t row_argmax(const float* row, int64_t K) {
  int64_t best = 0;
  for (int64_t k = 1; k < K; ++k)
    if (row[k] > row[best]) best = k;  // strict '>' keeps the first maximum
  return static_cast<int32_t>(best);
}

// Threads: one row per thread per grid-stride step (K is a handful of classes: a serial scan).
__global__ void argmax_kernel(const float* __restrict__ x, int32_t* __restrict__ idx, int64_t N, int64_t K) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < N; i += stride) idx[i] = row_argmax(x + i * K, K);
}

// Threads: one block; thread t checks rows t, t + blockDim.x, ... and block_sum adds the counts.
// One block is enough: N is one batch of predictions, and integer counts add up exactly in any order.
__global__ void count_correct_kernel(const float* __restrict__ x, const int32_t* __restrict__ labels,
                                     float* __restrict__ correct, int64_t N, int64_t K) {
  D2L_SHARED(int, warp_sums, [32]);
  int n_ok = 0;
  for (int64_t i = threadIdx.x; i < N; i += blockDim.x) n_ok += row_argmax(x + i * K, K) == labels[i];
  n_ok = block_sum(n_ok, warp_sums);
  if (threadIdx.x == 0) correct[0] = static_cast<float>(n_ok);
}

void argmax(Stream stream, const float* x, int32_t* idx, int64_t N, int64_t K) {
  D2L_LAUNCH_OVER(N, stream, argmax_kernel, x, idx, N, K);
}

void count_correct(Stream stream, const float* x, const int32_t* labels, float* correct, int64_t N, int64_t K) {
  D2L_LAUNCH(count_correct_kernel, 1, kThreads, 0, stream)(x, labels, correct, N, K);  // N == 0: writes 0
  D2L_CHECK_LAUNCH(count_correct_kernel);
}

}  // namespace D2L_CUDA_NS
