// Batch normalisation over channels: the CUDA twin of kernels/cpu/batch_norm.cpp.
// x (N, C, HW), gamma and beta (C); dense layers use HW = 1. Each channel c normalises its
// M = N*HW values x[n][c][i]:
//   training  mean = sum(x) / M,  var = sum((x - mean)^2) / M       (biased; in double)
//             invstd = 1 / sqrt(var + eps),  xhat = (x - mean) * invstd,  y = gamma * xhat + beta
//             saves mean and invstd (C) for backward, and updates the running statistics
//             running_mean = (1 - momentum) * running_mean + momentum * mean
//             running_var  = (1 - momentum) * running_var  + momentum * var * M / (M - 1)  (unbiased;
//                            the biased var when M == 1)
//   eval      y = gamma * (x - running_mean) / sqrt(running_var + eps) + beta
//   backward  (training mode: mean and var depend on x)
//             dbeta = sum(dy),  dgamma = sum(dy * xhat)
//             dx = gamma * invstd / M * (M * dy - dbeta - xhat * dgamma)
// Training forward and backward: one block per channel (blockIdx.x = c). The block's threads stride
// over the channel's M values (m = n * HW + i, at x[(n * C + c) * HW + i]); the per-channel sums
// are block reductions (reduce.cuh: fixed order, the same bits on every run) whose result every
// thread receives, so each thread then writes its own share of y or dx.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

// Index in x of value m of channel ch.
__device__ __forceinline__ int64_t at(int64_t m, int64_t ch, int64_t C, int64_t HW) {
  return (m / HW * C + ch) * HW + m % HW;
}

__global__ void batch_norm_train_forward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                                const float* __restrict__ gamma, const float* __restrict__ beta,
                                                float eps, float momentum, float* __restrict__ y,
                                                float* __restrict__ mean, float* __restrict__ invstd,
                                                float* __restrict__ running_mean, float* __restrict__ running_var) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = blockIdx.x, M = N * HW;
  // Two passes in double: the mean, then the squared deviations from it.
  double sum = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) sum += x[at(m, ch, C, HW)];
  const double mu = block_sum(sum, warp_sums) / static_cast<double>(M);
  double sq = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const double d = x[at(m, ch, C, HW)] - mu;
    sq += d * d;
  }
  sq = block_sum(sq, warp_sums);
  const double var = sq / static_cast<double>(M);
  const double istd = 1.0 / sqrt(var + static_cast<double>(eps));

  const float scale = static_cast<float>(gamma[ch] * istd);  // y = scale * (x - mean) + beta
  const float mf = static_cast<float>(mu);
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t k = at(m, ch, C, HW);
    y[k] = scale * (x[k] - mf) + beta[ch];
  }

  if (threadIdx.x == 0) {
    mean[ch] = mf;
    invstd[ch] = static_cast<float>(istd);
    const double unbiased = M > 1 ? sq / static_cast<double>(M - 1) : var;
    running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mu);
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
  }
}

// Eval: elementwise. Threads: one element k per thread per grid-stride step; channel (k / HW) % C.
__global__ void batch_norm_eval_forward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                               const float* __restrict__ gamma, const float* __restrict__ beta,
                                               const float* __restrict__ running_mean,
                                               const float* __restrict__ running_var, float eps,
                                               float* __restrict__ y) {
  const int64_t total = N * C * HW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t ch = k / HW % C;
    const float scale = static_cast<float>(gamma[ch] / sqrt(static_cast<double>(running_var[ch]) + eps));
    y[k] = scale * (x[k] - running_mean[ch]) + beta[ch];
  }
}

__global__ void batch_norm_backward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                           const float* __restrict__ dy, const float* __restrict__ gamma,
                                           const float* __restrict__ mean, const float* __restrict__ invstd,
                                           float* __restrict__ dx, float* __restrict__ dgamma,
                                           float* __restrict__ dbeta) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = blockIdx.x, M = N * HW;
  const double mu = mean[ch], istd = invstd[ch];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t k = at(m, ch, C, HW);
    sum_dy += dy[k];
    sum_dy_xhat += dy[k] * ((x[k] - mu) * istd);
  }
  sum_dy = block_sum(sum_dy, warp_sums);
  sum_dy_xhat = block_sum(sum_dy_xhat, warp_sums);
  if (threadIdx.x == 0) {
    dbeta[ch] = static_cast<float>(sum_dy);
    dgamma[ch] = static_cast<float>(sum_dy_xhat);
  }

  // dx = gamma * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat)
  const double k1 = gamma[ch] * istd / static_cast<double>(M);
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t k = at(m, ch, C, HW);
    const double xhat = (x[k] - mu) * istd;
    dx[k] = static_cast<float>(k1 * (static_cast<double>(M) * dy[k] - sum_dy - xhat * sum_dy_xhat));
  }
}

// ---- launchers
void batch_norm_train_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum, float* y,
                              float* mean, float* invstd, float* running_mean, float* running_var) {
  if (C <= 0) return;
  D2L_LAUNCH(batch_norm_train_forward_kernel, static_cast<unsigned>(C), kReduceThreads, 0, stream)(
      N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var);
  D2L_CHECK_LAUNCH(batch_norm_train_forward_kernel);
}

void batch_norm_eval_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* gamma,
                             const float* beta, const float* running_mean, const float* running_var, float eps,
                             float* y) {
  const int64_t n = N * C * HW;
  if (n <= 0) return;
  D2L_LAUNCH(batch_norm_eval_forward_kernel, grid_for(n), kThreads, 0, stream)(N, C, HW, x, gamma, beta,
                                                                               running_mean, running_var, eps, y);
  D2L_CHECK_LAUNCH(batch_norm_eval_forward_kernel);
}

void batch_norm_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                         const float* gamma, const float* mean, const float* invstd, float* dx, float* dgamma,
                         float* dbeta) {
  if (C <= 0) return;
  D2L_LAUNCH(batch_norm_backward_kernel, static_cast<unsigned>(C), kReduceThreads, 0, stream)(
      N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
  D2L_CHECK_LAUNCH(batch_norm_backward_kernel);
}

}  // namespace D2L_CUDA_NS
