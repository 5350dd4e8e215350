// Batch normalisation in three pieces, for SyncBatchNorm: the CUDA twin of
// kernels/cpu/batch_norm_stats.cpp. x (N, C, HW) is one shard, M_j = N*HW its values per channel;
// stats (2, C): row 0 the mean, row 1 the biased variance.
//   stats      mean_j = sum(x) / M_j,  var_j = sum((x - mean_j)^2) / M_j   (two passes in double)
//              backward: dx = dmean_j / M_j + dvar_j * 2 (x - mean_j) / M_j
//   combine    K shards' stats (K, 2, C) and counts M_j -> the batch's (2, C), with M = sum M_j and
//              w_j = M_j / M (the parallel variance of Chan, Golub and LeVeque):
//                mean = sum w_j mean_j,  var = sum w_j (var_j + (mean_j - mean)^2)
//              backward: dmean_j = w_j (dmean + 2 (mean_j - mean) dvar),  dvar_j = w_j dvar
//   apply      invstd = 1 / sqrt(var + eps),  xhat = (x - mean) invstd,  y = gamma xhat + beta
//              backward: dbeta = sum(dy),  dgamma = sum(dy xhat),  dx = gamma invstd dy,
//                        dmean = -gamma invstd sum(dy),  dvar = -gamma invstd^2 sum(dy xhat) / 2
//   running    running = (1 - momentum) running + momentum batch, the variance times M / (M - 1)
// Launch shapes: the kernels with per-channel sums (stats forward, apply backward) run one block per
// channel (blockIdx.x = c), its threads striding over the channel's M values (m = n * HW + i, at
// x[(n * C + c) * HW + i]) and adding them with block_sum (reduce.cuh: fixed order); elementwise
// kernels (stats backward, apply forward) stride over the N*C*HW values, channel (k / HW) % C; the
// per-channel ones (combine, running) stride over C.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

// Index in x of value m of channel ch.
__device__ __forceinline__ int64_t stats_at(int64_t m, int64_t ch, int64_t C, int64_t HW) {
  return (m / HW * C + ch) * HW + m % HW;
}

__global__ void batch_norm_stats_forward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                                float* __restrict__ stats) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = blockIdx.x, M = N * HW;
  double sum = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) sum += x[stats_at(m, ch, C, HW)];
  const double mu = block_sum(sum, warp_sums) / static_cast<double>(M);
  double sq = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const double d = x[stats_at(m, ch, C, HW)] - mu;
    sq += d * d;
  }
  sq = block_sum(sq, warp_sums);
  if (threadIdx.x == 0) {
    stats[ch] = static_cast<float>(mu);
    stats[C + ch] = static_cast<float>(sq / static_cast<double>(M));
  }
}

__global__ void batch_norm_stats_backward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                                 const float* __restrict__ stats, const float* __restrict__ dstats,
                                                 float* __restrict__ dx) {
  const int64_t total = N * C * HW, stride = int64_t(gridDim.x) * blockDim.x;
  const double M = static_cast<double>(N * HW);
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t ch = k / HW % C;
    const double mu = stats[ch], dmean = dstats[ch] / M, dvar2 = 2.0 * dstats[C + ch] / M;
    dx[k] = static_cast<float>(dmean + dvar2 * (x[k] - mu));
  }
}

// stats (K, 2, C): shard j's mean at stats[(2j) C + ch], its variance at stats[(2j + 1) C + ch].
__global__ void batch_norm_combine_forward_kernel(int64_t K, int64_t C, const int32_t* __restrict__ counts,
                                                  const float* __restrict__ stats, float* __restrict__ out) {
  double M = 0.0;
  for (int64_t j = 0; j < K; ++j) M += counts[j];
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < C; ch += int64_t(gridDim.x) * blockDim.x) {
    double mu = 0.0;
    for (int64_t j = 0; j < K; ++j) mu += counts[j] / M * stats[2 * j * C + ch];
    double var = 0.0;
    for (int64_t j = 0; j < K; ++j) {
      const double d = stats[2 * j * C + ch] - mu;
      var += counts[j] / M * (stats[(2 * j + 1) * C + ch] + d * d);
    }
    out[ch] = static_cast<float>(mu);
    out[C + ch] = static_cast<float>(var);
  }
}

__global__ void batch_norm_combine_backward_kernel(int64_t K, int64_t C, const int32_t* __restrict__ counts,
                                                   const float* __restrict__ stats, const float* __restrict__ dout,
                                                   float* __restrict__ dstats) {
  double M = 0.0;
  for (int64_t j = 0; j < K; ++j) M += counts[j];
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < C; ch += int64_t(gridDim.x) * blockDim.x) {
    double mu = 0.0;  // the batch mean again, in double
    for (int64_t j = 0; j < K; ++j) mu += counts[j] / M * stats[2 * j * C + ch];
    for (int64_t j = 0; j < K; ++j) {
      const double w = counts[j] / M;
      dstats[2 * j * C + ch] = static_cast<float>(w * (dout[ch] + 2.0 * (stats[2 * j * C + ch] - mu) * dout[C + ch]));
      dstats[(2 * j + 1) * C + ch] = static_cast<float>(w * dout[C + ch]);
    }
  }
}

__global__ void batch_norm_apply_forward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                                const float* __restrict__ stats, const float* __restrict__ gamma,
                                                const float* __restrict__ beta, float eps, float* __restrict__ y) {
  const int64_t total = N * C * HW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < total; k += stride) {
    const int64_t ch = k / HW % C;
    const double istd = 1.0 / sqrt(static_cast<double>(stats[C + ch]) + static_cast<double>(eps));
    const float scale = static_cast<float>(gamma[ch] * istd);  // y = scale * (x - mean) + beta
    y[k] = scale * (x[k] - stats[ch]) + beta[ch];
  }
}

__global__ void batch_norm_apply_backward_kernel(int64_t N, int64_t C, int64_t HW, const float* __restrict__ x,
                                                 const float* __restrict__ dy, const float* __restrict__ stats,
                                                 const float* __restrict__ gamma, float eps, float* __restrict__ dx,
                                                 float* __restrict__ dstats, float* __restrict__ dgamma,
                                                 float* __restrict__ dbeta) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = blockIdx.x, M = N * HW;
  const double mu = stats[ch];
  const double istd = 1.0 / sqrt(static_cast<double>(stats[C + ch]) + static_cast<double>(eps));
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t k = stats_at(m, ch, C, HW);
    sum_dy += dy[k];
    sum_dy_xhat += dy[k] * ((x[k] - mu) * istd);
  }
  sum_dy = block_sum(sum_dy, warp_sums);
  sum_dy_xhat = block_sum(sum_dy_xhat, warp_sums);
  if (threadIdx.x == 0) {
    dbeta[ch] = static_cast<float>(sum_dy);
    dgamma[ch] = static_cast<float>(sum_dy_xhat);
    dstats[ch] = static_cast<float>(-gamma[ch] * istd * sum_dy);
    dstats[C + ch] = static_cast<float>(-0.5 * gamma[ch] * istd * istd * sum_dy_xhat);
  }
  const double k1 = gamma[ch] * istd;  // dx = gamma * invstd * dy: the statistics held fixed
  for (int64_t m = threadIdx.x; m < M; m += blockDim.x) {
    const int64_t k = stats_at(m, ch, C, HW);
    dx[k] = static_cast<float>(k1 * dy[k]);
  }
}

__global__ void batch_norm_update_running_kernel(int64_t C, int64_t M, const float* __restrict__ stats,
                                                 float momentum, float* __restrict__ running_mean,
                                                 float* __restrict__ running_var) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < C; ch += int64_t(gridDim.x) * blockDim.x) {
    const double var = stats[C + ch];
    const double unbiased = M > 1 ? var * static_cast<double>(M) / static_cast<double>(M - 1) : var;
    running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * stats[ch]);
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
  }
}

// ---- launchers (nothing to do for an empty shard or no channels)
void batch_norm_stats_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, float* stats) {
  if (C <= 0 || N * HW <= 0) return;
  D2L_LAUNCH(batch_norm_stats_forward_kernel, static_cast<unsigned>(C), kReduceThreads, 0, stream)(N, C, HW, x,
                                                                                                  stats);
  D2L_CHECK_LAUNCH(batch_norm_stats_forward_kernel);
}

void batch_norm_stats_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                               const float* dstats, float* dx) {
  const int64_t n = N * C * HW;
  D2L_LAUNCH_OVER(n, stream, batch_norm_stats_backward_kernel, N, C, HW, x, stats, dstats, dx);
}

void batch_norm_combine_forward(Stream stream, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                float* out) {
  if (C <= 0 || K <= 0) return;
  D2L_LAUNCH(batch_norm_combine_forward_kernel, grid_for(C), kThreads, 0, stream)(K, C, counts, stats, out);
  D2L_CHECK_LAUNCH(batch_norm_combine_forward_kernel);
}

void batch_norm_combine_backward(Stream stream, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                 const float* dout, float* dstats) {
  if (C <= 0 || K <= 0) return;
  D2L_LAUNCH(batch_norm_combine_backward_kernel, grid_for(C), kThreads, 0, stream)(K, C, counts, stats, dout, dstats);
  D2L_CHECK_LAUNCH(batch_norm_combine_backward_kernel);
}

void batch_norm_apply_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                              const float* gamma, const float* beta, float eps, float* y) {
  const int64_t n = N * C * HW;
  if (n <= 0) return;
  D2L_LAUNCH(batch_norm_apply_forward_kernel, grid_for(n), kThreads, 0, stream)(N, C, HW, x, stats, gamma, beta,
                                                                                eps, y);
  D2L_CHECK_LAUNCH(batch_norm_apply_forward_kernel);
}

void batch_norm_apply_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                               const float* stats, const float* gamma, float eps, float* dx, float* dstats,
                               float* dgamma, float* dbeta) {
  if (C <= 0) return;
  D2L_LAUNCH(batch_norm_apply_backward_kernel, static_cast<unsigned>(C), kReduceThreads, 0, stream)(
      N, C, HW, x, dy, stats, gamma, eps, dx, dstats, dgamma, dbeta);
  D2L_CHECK_LAUNCH(batch_norm_apply_backward_kernel);
}

void batch_norm_update_running(Stream stream, int64_t C, int64_t M, const float* stats, float momentum,
                               float* running_mean, float* running_var) {
  if (C <= 0) return;
  D2L_LAUNCH(batch_norm_update_running_kernel, grid_for(C), kThreads, 0, stream)(C, M, stats, momentum,
                                                                                 running_mean, running_var);
  D2L_CHECK_LAUNCH(batch_norm_update_running_kernel);
}

}  // namespace D2L_CUDA_NS
