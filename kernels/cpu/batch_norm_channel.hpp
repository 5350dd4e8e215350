// The per-channel loops batch_norm.cpp (one device) and batch_norm_stats.cpp (SyncBatchNorm's
// pieces) share, over channel ch of x (N, C, HW): written once, so both compute the same bits.
#pragma once
#include <cstdint>

namespace d2l::kernels::cpu {

// The channel's mean and the sum of its squared deviations from it: two passes, in double.
struct ChannelMoments {
  double mean = 0.0, sq = 0.0;
};
inline ChannelMoments channel_moments(int64_t N, int64_t C, int64_t HW, const float* x, int64_t ch) {
  double sum = 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) sum += x[(n * C + ch) * HW + i];
  ChannelMoments m;
  m.mean = sum / static_cast<double>(N * HW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const double d = x[(n * C + ch) * HW + i] - m.mean;
      m.sq += d * d;
    }
  return m;
}

// y = scale * (x - mean) + beta over the channel.
inline void channel_normalize(int64_t N, int64_t C, int64_t HW, const float* x, int64_t ch, float scale, float mean,
                              float beta, float* y) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const int64_t k = (n * C + ch) * HW + i;
      y[k] = scale * (x[k] - mean) + beta;
    }
}

// The backward's two sums over the channel: sum(dy) and sum(dy * xhat), xhat = (x - mean) * invstd.
struct ChannelGradSums {
  double dy = 0.0, dy_xhat = 0.0;
};
inline ChannelGradSums channel_grad_sums(int64_t N, int64_t C, int64_t HW, const float* x, const float* dy, int64_t ch,
                                         double mean, double invstd) {
  ChannelGradSums s;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const int64_t k = (n * C + ch) * HW + i;
      s.dy += dy[k];
      s.dy_xhat += dy[k] * ((x[k] - mean) * invstd);
    }
  return s;
}

}  // namespace d2l::kernels::cpu
