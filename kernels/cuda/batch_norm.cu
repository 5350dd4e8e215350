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
//
// How the training passes run (channel_chunks.cuh: a channel's M values cut into chunks, one block
// per (chunk, channel), float4 loads where HW is a multiple of 4, no division per value):
//   forward   1. partial statistics: each block reads its chunk once and computes the chunk's
//                (count, mean, M2), M2 = sum((x - chunk mean)^2), in double;
//             2. combine, one thread per channel: the chunks' partials folded left to right with the
//                parallel formula of Chan, Golub and LeVeque; mean, invstd, the running statistics;
//             3. apply: each block normalises its chunk, y = scale * (x - mean) + beta.
//   backward  1. partial sums of dy and dy * xhat for each chunk;
//             2. finish, one thread per channel: the chunks' sums added left to right: dbeta, dgamma;
//             3. dx for each chunk, elementwise.
// Every partial has its own slot and is combined in chunk order by one thread, so the results have
// the same bits on every run, whatever the number of threads the blocks ran on (no atomics). Each
// pass reads x (and dy) once: 3 trips over the tensor forward (read, read, write), 4 backward.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/channel_chunks.cuh"

namespace D2L_CUDA_NS {

// ---- forward

// A chunk's statistics: its count of values, their mean and M2, the sum of squared deviations from
// that mean (the variance is M2 / count).
struct ChunkStats {
  double count, mean, m2;
};

// Two sets of values as one (Chan, Golub and LeVeque): with n = na + nb and d = mean_b - mean_a,
//   mean = mean_a + d * nb / n,   M2 = M2_a + M2_b + d^2 * na * nb / n.
// Exact in exact arithmetic; in floating point it avoids the cancellation of sum(x^2) - n mean^2.
__device__ __forceinline__ ChunkStats chan_combine(const ChunkStats& a, const ChunkStats& b) {
  const double n = a.count + b.count, d = b.mean - a.mean;
  return {n, a.mean + d * (b.count / n), a.m2 + b.m2 + d * d * (a.count * b.count / n)};
}

// Pass 1. Grid (chunks, channels), blockDim.x = kReduceThreads. One read of the chunk: the sums of
// d = x - K and d^2 in double, shifted by K, the chunk's first value, then
//   mean = K + sum(d) / n,   M2 = sum(d^2) - sum(d)^2 / n.
// The shift keeps the subtraction from cancelling: K lies among the chunk's values, so sum(d)^2 / n
// is of the size of M2 itself, not of n mean^2 (the textbook sum(x^2) - n mean^2 loses every digit
// when the mean is large next to the spread; here double's 53 bits leave far more than float's 24).
__global__ void batch_norm_partial_stats_kernel(ChannelChunks w, int64_t first_channel, const float* __restrict__ x,
                                                ChunkStats* __restrict__ partials) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = first_channel + blockIdx.y;
  const int chunk = static_cast<int>(blockIdx.x);
  const double shift = x[chunk_start(w, ch, chunk)];
  double sum = 0.0, sq = 0.0;
  for_thread_loads(w, ch, chunk, [&](int64_t at) {
    float v[4] = {};
    load_values(x + at, w.vec, v);
    for (int e = 0; e < 4; ++e)
      if (e < w.vec) {
        const double d = v[e] - shift;
        sum += d;
        sq += d * d;
      }
  });
  sum = block_sum(sum, warp_sums);
  sq = block_sum(sq, warp_sums);
  if (threadIdx.x == 0) {
    const double n = chunk_values(w, chunk), m2 = sq - sum * sum / n;
    partials[ch * w.chunks + chunk] = {n, shift + sum / n, m2 > 0.0 ? m2 : 0.0};  // rounding can dip below 0
  }
}

// Pass 2. One thread per channel (grid-stride over C): the partials folded in chunk order, then the
// header's formulas. scale = gamma * invstd goes to the apply pass.
__global__ void batch_norm_combine_stats_kernel(ChannelChunks w, const ChunkStats* __restrict__ partials,
                                                const float* __restrict__ gamma, float eps, float momentum,
                                                float* __restrict__ mean, float* __restrict__ invstd,
                                                float* __restrict__ scale, float* __restrict__ running_mean,
                                                float* __restrict__ running_var) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < w.C; ch += int64_t(gridDim.x) * blockDim.x) {
    const ChunkStats* p = partials + ch * w.chunks;
    ChunkStats all = p[0];
    for (int b = 1; b < w.chunks; ++b) all = chan_combine(all, p[b]);
    const double M = all.count, var = all.m2 / M;
    const double istd = 1.0 / sqrt(var + static_cast<double>(eps));
    mean[ch] = static_cast<float>(all.mean);
    invstd[ch] = static_cast<float>(istd);
    scale[ch] = static_cast<float>(gamma[ch] * istd);  // y = scale * (x - mean) + beta
    const double unbiased = M > 1 ? all.m2 / (M - 1) : var;
    running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * all.mean);
    running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
  }
}

// Pass 3. Grid (chunks, channels) as pass 1: y = scale * (x - mean) + beta, the CPU's float operations.
__global__ void batch_norm_apply_kernel(ChannelChunks w, int64_t first_channel, const float* __restrict__ x,
                                        const float* __restrict__ mean, const float* __restrict__ scale,
                                        const float* __restrict__ beta, float* __restrict__ y) {
  const int64_t ch = first_channel + blockIdx.y;
  const float m = mean[ch], s = scale[ch], b = beta[ch];
  for_thread_loads(w, ch, static_cast<int>(blockIdx.x), [&](int64_t at) {
    float v[4] = {};
    load_values(x + at, w.vec, v);
    for (int e = 0; e < 4; ++e) v[e] = s * (v[e] - m) + b;  // past vec: unused
    store_values(y + at, w.vec, v);
  });
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

// ---- backward

// A chunk's two sums for the backward: sum(dy) and sum(dy * xhat).
struct GradSums {
  double dy, dy_xhat;
};

// Pass 1. Grid (chunks, channels): each block sums dy and dy * xhat over its chunk, in double.
__global__ void batch_norm_partial_grad_sums_kernel(ChannelChunks w, int64_t first_channel,
                                                    const float* __restrict__ x, const float* __restrict__ dy,
                                                    const float* __restrict__ mean, const float* __restrict__ invstd,
                                                    GradSums* __restrict__ partials) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = first_channel + blockIdx.y;
  const int chunk = static_cast<int>(blockIdx.x);
  const double mu = mean[ch], istd = invstd[ch];
  double sum_dy = 0.0, sum_dy_xhat = 0.0;
  for_thread_loads(w, ch, chunk, [&](int64_t at) {
    float xv[4] = {}, g[4] = {};
    load_values(x + at, w.vec, xv);
    load_values(dy + at, w.vec, g);
    for (int e = 0; e < 4; ++e)
      if (e < w.vec) {
        sum_dy += g[e];
        sum_dy_xhat += g[e] * ((xv[e] - mu) * istd);
      }
  });
  sum_dy = block_sum(sum_dy, warp_sums);
  sum_dy_xhat = block_sum(sum_dy_xhat, warp_sums);
  if (threadIdx.x == 0) partials[ch * w.chunks + chunk] = {sum_dy, sum_dy_xhat};
}

// Pass 2. One thread per channel: the chunks' sums added in chunk order; dbeta and dgamma, and the
// sums in double for the dx pass.
__global__ void batch_norm_finish_grad_sums_kernel(ChannelChunks w, const GradSums* __restrict__ partials,
                                                   GradSums* __restrict__ totals, float* __restrict__ dgamma,
                                                   float* __restrict__ dbeta) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < w.C; ch += int64_t(gridDim.x) * blockDim.x) {
    const GradSums* p = partials + ch * w.chunks;
    GradSums all = p[0];
    for (int b = 1; b < w.chunks; ++b) {
      all.dy += p[b].dy;
      all.dy_xhat += p[b].dy_xhat;
    }
    totals[ch] = all;
    dbeta[ch] = static_cast<float>(all.dy);
    dgamma[ch] = static_cast<float>(all.dy_xhat);
  }
}

// Pass 3. Grid (chunks, channels), elementwise:
//   dx = gamma * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat), in double as the CPU's.
__global__ void batch_norm_input_grad_kernel(ChannelChunks w, int64_t first_channel, int64_t M,
                                             const float* __restrict__ x, const float* __restrict__ dy,
                                             const float* __restrict__ gamma, const float* __restrict__ mean,
                                             const float* __restrict__ invstd, const GradSums* __restrict__ totals,
                                             float* __restrict__ dx) {
  const int64_t ch = first_channel + blockIdx.y;
  const double mu = mean[ch], istd = invstd[ch], m = static_cast<double>(M);
  const double k1 = gamma[ch] * istd / m;
  const GradSums sums = totals[ch];
  for_thread_loads(w, ch, static_cast<int>(blockIdx.x), [&](int64_t at) {
    float xv[4] = {}, g[4] = {};
    load_values(x + at, w.vec, xv);
    load_values(dy + at, w.vec, g);
    for (int e = 0; e < 4; ++e) {  // past vec: unused
      const double xhat = (xv[e] - mu) * istd;
      g[e] = static_cast<float>(k1 * (m * g[e] - sums.dy - xhat * sums.dy_xhat));
    }
    store_values(dx + at, w.vec, g);
  });
}

// ---- launchers

void batch_norm_train_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum, float* y,
                              float* mean, float* invstd, float* running_mean, float* running_var) {
  if (C <= 0 || N * HW <= 0) return;
  const ChannelChunks w = channel_chunks("batch_norm", N, C, HW, kReduceThreads, aligned16(x) && aligned16(y));
  ScratchBuffer<ChunkStats> partials(stream, C * w.chunks);
  ScratchBuffer<float> scale(stream, C);
  for_channel_slices(C, [&](int64_t c0, int64_t count) {
    const dim3 grid(static_cast<unsigned>(w.chunks), static_cast<unsigned>(count));
    D2L_LAUNCH(batch_norm_partial_stats_kernel, grid, kReduceThreads, 0, stream)(w, c0, x, partials.data());
    D2L_CHECK_LAUNCH(batch_norm_partial_stats_kernel);
  });
  D2L_LAUNCH(batch_norm_combine_stats_kernel, grid_for(C), kThreads, 0, stream)(
      w, partials.data(), gamma, eps, momentum, mean, invstd, scale.data(), running_mean, running_var);
  D2L_CHECK_LAUNCH(batch_norm_combine_stats_kernel);
  for_channel_slices(C, [&](int64_t c0, int64_t count) {
    const dim3 grid(static_cast<unsigned>(w.chunks), static_cast<unsigned>(count));
    D2L_LAUNCH(batch_norm_apply_kernel, grid, kReduceThreads, 0, stream)(w, c0, x, mean, scale.data(), beta, y);
    D2L_CHECK_LAUNCH(batch_norm_apply_kernel);
  });
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
  if (C <= 0 || N * HW <= 0) return;
  const ChannelChunks w =
      channel_chunks("batch_norm_backward", N, C, HW, kReduceThreads, aligned16(x) && aligned16(dy) && aligned16(dx));
  ScratchBuffer<GradSums> partials(stream, C * w.chunks), totals(stream, C);
  for_channel_slices(C, [&](int64_t c0, int64_t count) {
    const dim3 grid(static_cast<unsigned>(w.chunks), static_cast<unsigned>(count));
    D2L_LAUNCH(batch_norm_partial_grad_sums_kernel, grid, kReduceThreads, 0, stream)(w, c0, x, dy, mean, invstd,
                                                                                      partials.data());
    D2L_CHECK_LAUNCH(batch_norm_partial_grad_sums_kernel);
  });
  D2L_LAUNCH(batch_norm_finish_grad_sums_kernel, grid_for(C), kThreads, 0, stream)(w, partials.data(),
                                                                                    totals.data(), dgamma, dbeta);
  D2L_CHECK_LAUNCH(batch_norm_finish_grad_sums_kernel);
  for_channel_slices(C, [&](int64_t c0, int64_t count) {
    const dim3 grid(static_cast<unsigned>(w.chunks), static_cast<unsigned>(count));
    D2L_LAUNCH(batch_norm_input_grad_kernel, grid, kReduceThreads, 0, stream)(w, c0, N * HW, x, dy, gamma, mean,
                                                                               invstd, totals.data(), dx);
    D2L_CHECK_LAUNCH(batch_norm_input_grad_kernel);
  });
}

}  // namespace D2L_CUDA_NS
