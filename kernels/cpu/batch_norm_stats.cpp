// Batch normalisation in three pieces, for SyncBatchNorm (core/ops.hpp): each device
// computes its shard's statistics, one device combines them into the whole batch's, and every
// device normalises its own shard with those. x (N, C, HW) is one shard (dense layers: HW = 1),
// M_j = N*HW its values per channel; stats (2, C): row 0 the mean, row 1 the biased variance.
//   stats      mean_j = sum(x) / M_j,  var_j = sum((x - mean_j)^2) / M_j   (two passes in double)
//              backward: dx = dmean_j / M_j + dvar_j * 2 (x - mean_j) / M_j
//   combine    K shards' stats (K, 2, C) and counts M_j -> the batch's (2, C), with M = sum M_j and
//              w_j = M_j / M (the parallel variance of Chan, Golub and LeVeque: no E[x^2] - mean^2):
//                mean = sum w_j mean_j,  var = sum w_j (var_j + (mean_j - mean)^2)
//              backward: dmean_j = w_j (dmean + 2 (mean_j - mean) dvar),  dvar_j = w_j dvar
//   apply      invstd = 1 / sqrt(var + eps),  xhat = (x - mean) invstd,  y = gamma xhat + beta
//              backward: dbeta = sum(dy),  dgamma = sum(dy xhat),  dx = gamma invstd dy,
//                        dmean = -gamma invstd sum(dy),  dvar = -gamma invstd^2 sum(dy xhat) / 2
//   running    running_mean = (1 - momentum) running_mean + momentum mean,
//              running_var  = (1 - momentum) running_var  + momentum var M / (M - 1)  (unbiased; the
//                             biased var when M == 1), as batch_norm_train_forward
// Chained, the three backward passes add up to batch_norm_backward's dx over the whole batch,
//   dx = gamma invstd / M (M dy - sum(dy) - xhat sum(dy xhat)),  the sums over every shard.
// Every channel is independent: all loops split over C.
#include <cmath>

#include "batch_norm_channel.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void batch_norm_stats_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, float* stats) {
  const int64_t M = N * HW;
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const ChannelMoments mo = channel_moments(N, C, HW, x, ch);
      stats[ch] = static_cast<float>(mo.mean);
      stats[C + ch] = static_cast<float>(mo.sq / static_cast<double>(M));
    }
  });
}

void batch_norm_stats_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                               const float* dstats, float* dx) {
  const double M = static_cast<double>(N * HW);
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double mu = stats[ch], dmean = dstats[ch] / M, dvar2 = 2.0 * dstats[C + ch] / M;
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t k = (n * C + ch) * HW + i;
          dx[k] = static_cast<float>(dmean + dvar2 * (x[k] - mu));
        }
    }
  });
}

// stats (K, 2, C): shard j's mean at stats[(2j) C + ch], its variance at stats[(2j + 1) C + ch].
void batch_norm_combine_forward(const Ctx& c, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                float* out) {
  double M = 0.0;
  for (int64_t j = 0; j < K; ++j) M += counts[j];
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
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
  });
}

void batch_norm_combine_backward(const Ctx& c, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                 const float* dout, float* dstats) {
  double M = 0.0;
  for (int64_t j = 0; j < K; ++j) M += counts[j];
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      double mu = 0.0;  // the batch mean again, in double
      for (int64_t j = 0; j < K; ++j) mu += counts[j] / M * stats[2 * j * C + ch];
      for (int64_t j = 0; j < K; ++j) {
        const double w = counts[j] / M;
        dstats[2 * j * C + ch] = static_cast<float>(w * (dout[ch] + 2.0 * (stats[2 * j * C + ch] - mu) * dout[C + ch]));
        dstats[(2 * j + 1) * C + ch] = static_cast<float>(w * dout[C + ch]);
      }
    }
  });
}

void batch_norm_apply_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                              const float* gamma, const float* beta, float eps, float* y) {
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double istd = 1.0 / std::sqrt(static_cast<double>(stats[C + ch]) + static_cast<double>(eps));
      channel_normalize(N, C, HW, x, ch, static_cast<float>(gamma[ch] * istd), stats[ch], beta[ch], y);
    }
  });
}

void batch_norm_apply_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                               const float* stats, const float* gamma, float eps, float* dx, float* dstats,
                               float* dgamma, float* dbeta) {
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double mu = stats[ch];
      const double istd = 1.0 / std::sqrt(static_cast<double>(stats[C + ch]) + static_cast<double>(eps));
      const ChannelGradSums g = channel_grad_sums(N, C, HW, x, dy, ch, mu, istd);
      const double sum_dy = g.dy, sum_dy_xhat = g.dy_xhat;
      dbeta[ch] = static_cast<float>(sum_dy);
      dgamma[ch] = static_cast<float>(sum_dy_xhat);
      dstats[ch] = static_cast<float>(-gamma[ch] * istd * sum_dy);
      dstats[C + ch] = static_cast<float>(-0.5 * gamma[ch] * istd * istd * sum_dy_xhat);

      const double k1 = gamma[ch] * istd;  // dx = gamma * invstd * dy: the statistics held fixed
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t k = (n * C + ch) * HW + i;
          dx[k] = static_cast<float>(k1 * dy[k]);
        }
    }
  });
}

void batch_norm_update_running(const Ctx& c, int64_t C, int64_t M, const float* stats, float momentum,
                               float* running_mean, float* running_var) {
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double var = stats[C + ch];
      const double unbiased = M > 1 ? var * static_cast<double>(M) / static_cast<double>(M - 1) : var;
      running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * stats[ch]);
      running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
  });
}

}  // namespace d2l::kernels::cpu
