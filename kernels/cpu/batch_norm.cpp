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
// Every channel is independent: all loops split over C. The loops are activation_loops.hpp's, shared
// with the 16-bit activations (activations16.cpp).
#include "activation_loops_once.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void batch_norm_train_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x,
                              const float* gamma, const float* beta, float eps, float momentum, float* y,
                              float* mean, float* invstd, float* running_mean, float* running_var) {
  loops::bn_train_forward<AsF32>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var);
}

void batch_norm_eval_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x,
                             const float* gamma, const float* beta, const float* running_mean,
                             const float* running_var, float eps, float* y) {
  loops::bn_eval_forward<AsF32>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y);
}

void batch_norm_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                         const float* gamma, const float* mean, const float* invstd, float* dx, float* dgamma,
                         float* dbeta) {
  loops::bn_backward<AsF32>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta);
}

}  // namespace d2l::kernels::cpu
