// softmax cross-entropy, logits (N, K), labels (N) in [0, K):
// loss[i] = logsumexp(logits[i]) - logits[i][label[i]];
// backward: dlogits[i][k] = dloss[i] * (softmax(logits[i])[k] - (k == label[i])).
// The CUDA twin of kernels/cpu/softmax_ce.cpp.
// Threads: one warp per row (8 rows per 256-thread block, grid-stride over rows); lane l takes the
// row's columns l, l + 32, ..., and the warp combines the lanes with shuffles (reduce.cuh).
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

namespace {
constexpr int kRowsPerBlock = kThreads / 32;

unsigned grid_for_rows(int64_t N) { return grid_for(N * 32); }  // 32 threads a row
}  // namespace

// Stable log-sum-exp pieces of one row, in every lane of the warp: m = max, s = sum exp(x - m)
// (in double, every term <= 1).
__device__ __forceinline__ void warp_row_max_sumexp(const float* x, int64_t K, int lane, double& m, double& s) {
  float mf = -INFINITY;
  for (int64_t k = lane; k < K; k += 32) mf = x[k] > mf ? x[k] : mf;
  m = warp_max(mf);
  s = 0.0;
  for (int64_t k = lane; k < K; k += 32) s += exp(static_cast<double>(x[k]) - m);
  s = __shfl_sync(0xffffffffu, warp_sum(s), 0);  // lane 0 holds the total: give it to every lane
}

__global__ void softmax_ce_forward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                          float* __restrict__ loss, int64_t N, int64_t K) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kRowsPerBlock;  // every row index below is the same in a warp
  for (int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; i < N; i += warps) {
    const float* x = logits + i * K;
    double m, s;
    warp_row_max_sumexp(x, K, lane, m, s);
    if (lane == 0) loss[i] = static_cast<float>(m + log(s) - x[labels[i]]);
  }
}

__global__ void softmax_ce_backward_kernel(const float* __restrict__ logits, const int32_t* __restrict__ labels,
                                           const float* __restrict__ dloss, float* __restrict__ dlogits, int64_t N,
                                           int64_t K) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = int64_t(gridDim.x) * kRowsPerBlock;
  for (int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + threadIdx.x / 32; i < N; i += warps) {
    const float* x = logits + i * K;
    float* dx = dlogits + i * K;
    double m, s;
    warp_row_max_sumexp(x, K, lane, m, s);
    for (int64_t k = lane; k < K; k += 32) {
      const double p = exp(static_cast<double>(x[k]) - m) / s;
      dx[k] = static_cast<float>(dloss[i] * (p - (k == labels[i] ? 1.0 : 0.0)));
    }
  }
}

void softmax_ce_forward(Stream stream, const float* logits, const int32_t* labels, float* loss, int64_t N,
                        int64_t K) {
  if (N <= 0) return;
  D2L_LAUNCH(softmax_ce_forward_kernel, grid_for_rows(N), kThreads, 0, stream)(logits, labels, loss, N, K);
  D2L_CHECK_LAUNCH(softmax_ce_forward_kernel);
}

void softmax_ce_backward(Stream stream, const float* logits, const int32_t* labels, const float* dloss,
                         float* dlogits, int64_t N, int64_t K) {
  if (N <= 0) return;
  D2L_LAUNCH(softmax_ce_backward_kernel, grid_for_rows(N), kThreads, 0, stream)(logits, labels, dloss, dlogits,
                                                                                N, K);
  D2L_CHECK_LAUNCH(softmax_ce_backward_kernel);
}

}  // namespace D2L_CUDA_NS
