// Batch normalisation over channels: x (N, C, HW), gamma and beta (C). Dense layers use HW = 1.
// Each channel c normalises its M = N*HW values x[n][c][i]:
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
// Every channel is independent: all loops split over C. Written once over the element type of x, y,
// dy and dx (float16.hpp's V): float32, and the 16-bit activations of autocast on CPU devices
// (batch_norm16_*: read widened, statistics and sums as for float32, each output rounded once).
#include <cmath>

#include "batch_norm_channel.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

template <class V>
void train_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const float* gamma,
                   const float* beta, float eps, float momentum, typename V::T* y, float* mean, float* invstd,
                   float* running_mean, float* running_var) {
  const int64_t M = N * HW;
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const ChannelMoments mo = channel_moments<V>(N, C, HW, x, ch);  // two passes in double
      const double mu = mo.mean, sq = mo.sq;
      const double var = sq / static_cast<double>(M);
      const double istd = 1.0 / std::sqrt(var + static_cast<double>(eps));

      const float m = static_cast<float>(mu);  // y = scale * (x - mean) + beta
      channel_normalize<V>(N, C, HW, x, ch, static_cast<float>(gamma[ch] * istd), m, beta[ch], y);

      mean[ch] = m;
      invstd[ch] = static_cast<float>(istd);
      const double unbiased = M > 1 ? sq / static_cast<double>(M - 1) : var;
      running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mu);
      running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
  });
}

template <class V>
void eval_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const float* gamma,
                  const float* beta, const float* running_mean, const float* running_var, float eps, typename V::T* y) {
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const float scale =
          static_cast<float>(gamma[ch] / std::sqrt(static_cast<double>(running_var[ch]) + eps));
      channel_normalize<V>(N, C, HW, x, ch, scale, running_mean[ch], beta[ch], y);
    }
  });
}

template <class V>
void backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const typename V::T* dy,
              const float* gamma, const float* mean, const float* invstd, typename V::T* dx, float* dgamma, float* dbeta) {
  const int64_t M = N * HW;
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double mu = mean[ch], istd = invstd[ch];
      const ChannelGradSums g = channel_grad_sums<V>(N, C, HW, x, dy, ch, mu, istd);
      const double sum_dy = g.dy, sum_dy_xhat = g.dy_xhat;
      dbeta[ch] = static_cast<float>(sum_dy);
      dgamma[ch] = static_cast<float>(sum_dy_xhat);

      // dx = gamma * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat)
      const double k1 = gamma[ch] * istd / static_cast<double>(M);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t k = (n * C + ch) * HW + i;
          const double xhat = (V::get(x[k]) - mu) * istd;
          dx[k] = V::put(static_cast<float>(k1 * (static_cast<double>(M) * V::get(dy[k]) - sum_dy - xhat * sum_dy_xhat)));
        }
    }
  });
}

}  // namespace

void batch_norm_train_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum, float* y,
                              float* mean, float* invstd, float* running_mean, float* running_var) {
  train_forward<AsF32>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var);
}

void batch_norm_eval_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y) {
  eval_forward<AsF32>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y);
}

void batch_norm_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                         const float* gamma, const float* mean, const float* invstd, float* dx, float* dgamma,
                         float* dbeta) {
  backward<AsF32>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
}

void batch_norm16_train_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                                const float* gamma, const float* beta, float eps, float momentum, uint16_t* y,
                                float* mean, float* invstd, float* running_mean, float* running_var) {
  if (f == Float16::bf16)
    train_forward<As16<Float16::bf16>>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var);
  else
    train_forward<As16<Float16::f16>>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var);
}

void batch_norm16_eval_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                               const float* gamma, const float* beta, const float* running_mean,
                               const float* running_var, float eps, uint16_t* y) {
  if (f == Float16::bf16) eval_forward<As16<Float16::bf16>>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y);
  else eval_forward<As16<Float16::f16>>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y);
}

void batch_norm16_backward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                           const uint16_t* dy, const float* gamma, const float* mean, const float* invstd, uint16_t* dx,
                           float* dgamma, float* dbeta) {
  if (f == Float16::bf16) backward<As16<Float16::bf16>>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
  else backward<As16<Float16::f16>>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
}

}  // namespace d2l::kernels::cpu
