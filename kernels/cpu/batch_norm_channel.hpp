// The per-channel loops batch_norm.cpp (one device) and batch_norm_stats.cpp (SyncBatchNorm's
// pieces) share, over channel ch of x (N, C, HW): written once, so both compute the same bits. V is
// the element type of x, y and dy (float16.hpp: float32, or a 16-bit format read widened and written
// rounded once); the statistics are float32 and the sums double whatever it is.
#pragma once
#include <cstdint>

#include "float16.hpp"

namespace d2l::kernels::cpu {

// The channel's mean and the sum of its squared deviations from it: two passes, in double.
struct ChannelMoments {
  double mean = 0.0, sq = 0.0;
};
template <class V = AsF32>
inline ChannelMoments channel_moments(int64_t N, int64_t C, int64_t HW, const typename V::T* x, int64_t ch) {
  double sum = 0.0;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) sum += V::get(x[(n * C + ch) * HW + i]);
  ChannelMoments m;
  m.mean = sum / static_cast<double>(N * HW);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const double d = V::get(x[(n * C + ch) * HW + i]) - m.mean;
      m.sq += d * d;
    }
  return m;
}

// y = scale * (x - mean) + beta over the channel.
template <class V = AsF32>
inline void channel_normalize(int64_t N, int64_t C, int64_t HW, const typename V::T* x, int64_t ch, float scale,
                              float mean, float beta, typename V::T* y) {
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const int64_t k = (n * C + ch) * HW + i;
      y[k] = V::put(scale * (V::get(x[k]) - mean) + beta);
    }
}

// The backward's two sums over the channel: sum(dy) and sum(dy * xhat), xhat = (x - mean) * invstd.
struct ChannelGradSums {
  double dy = 0.0, dy_xhat = 0.0;
};
template <class V = AsF32>
inline ChannelGradSums channel_grad_sums(int64_t N, int64_t C, int64_t HW, const typename V::T* x,
                                         const typename V::T* dy, int64_t ch, double mean, double invstd) {
  ChannelGradSums s;
  for (int64_t n = 0; n < N; ++n)
    for (int64_t i = 0; i < HW; ++i) {
      const int64_t k = (n * C + ch) * HW + i;
      const float g = V::get(dy[k]);
      s.dy += g;
      s.dy_xhat += g * ((V::get(x[k]) - mean) * invstd);
    }
  return s;
}

}  // namespace d2l::kernels::cpu
