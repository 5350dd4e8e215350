// batch_norm: one device's batch normalisation, training and evaluation (kernels/{cpu,cuda}/batch_norm).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/batch_norm.cpp, kernels/cuda/batch_norm.cu): x (N, C, HW), per-channel
// gamma/beta (C). Training: batch mean/var (biased) normalise; saves mean and invstd = 1/sqrt(var + eps)
// (C each); running_mean/var (C) updated as running = (1 - momentum) * running + momentum * batch, with
// the unbiased batch variance for running_var (PyTorch's convention; momentum 0.1 there). Evaluation
// normalises with the running statistics. The backward is training mode's (batch statistics depend on
// x); dx, dgamma, dbeta overwritten.
D2L_DECLARE_KERNEL(batch_norm_train_forward, int64_t N, int64_t C, int64_t HW, const float* x, const float* gamma,
                   const float* beta, float eps, float momentum, float* y, float* mean, float* invstd,
                   float* running_mean, float* running_var);
D2L_DECLARE_KERNEL(batch_norm_eval_forward, int64_t N, int64_t C, int64_t HW, const float* x, const float* gamma,
                   const float* beta, const float* running_mean, const float* running_var, float eps, float* y);
D2L_DECLARE_KERNEL(batch_norm_backward, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                   const float* gamma, const float* mean, const float* invstd, float* dx, float* dgamma, float* dbeta);

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

// Evaluation statistics are constants, and evaluation has no backward: asking for one is an error.
static void record_evaluation(const Tensor& y, const Tensor& x, const Tensor& gamma, const Tensor& beta) {
  record(y, "batch_norm", {x, gamma, beta}, [](const Tensor&) -> std::vector<Tensor> {
    throw std::logic_error("batch_norm: backward in evaluation mode is not supported; train with TrainMode(true)");
  });
}

// A 16-bit x on a CPU device (autocast's activations there): kernels/cpu's batch_norm16_*, the same
// computation with x, y and dx in x's type; the parameters, statistics and their gradients float32.
static Tensor batch_norm_16bit(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                               const Tensor& running_var, float momentum, float eps) {
  const DType t = x.dtype();
  const k::Float16 f = float16_of(t);
  const Device d = x.device();
  const int64_t N = x.dim(0), C = x.dim(1), HW = x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1;
  Tensor y = Tensor::empty(x.shape(), d, t);
  const uint16_t* X = x.data16();
  uint16_t* Y = y.data16();
  const float *G = gamma.data(), *B = beta.data();
  float *RM = running_mean.data(), *RV = running_var.data();
  if (!is_training()) {
    launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y}),
           [=](const LaunchCtx& c) { k::batch_norm16_eval_forward(c.cpu, f, N, C, HW, X, G, B, RM, RV, eps, Y); });
    record_evaluation(y, x, gamma, beta);
    return y;
  }
  if (N * HW < 2) fail("batch_norm", "training needs more than one value per channel, got " + str(x.shape()));
  Tensor mean = Tensor::empty({C}, d), invstd = Tensor::empty({C}, d);
  float *M = mean.data(), *S = invstd.data();
  launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y, mean, invstd}), [=](const LaunchCtx& c) {
    k::batch_norm16_train_forward(c.cpu, f, N, C, HW, X, G, B, eps, momentum, Y, M, S, RM, RV);
  });
  record(y, "batch_norm", {x, gamma, beta}, [x, gamma, mean, invstd, N, C, HW, t, f](const Tensor& gy_in) {
    const Tensor gy = cast(gy_in, t);
    Tensor gx = Tensor::empty(x.shape(), x.device(), t), gg = Tensor::empty({C}, x.device()), gb = Tensor::empty({C}, x.device());
    const uint16_t *X = x.data16(), *GY = gy.data16();
    const float *G = gamma.data(), *M = mean.data(), *S = invstd.data();
    uint16_t* GX = gx.data16();
    float *GG = gg.data(), *GB = gb.data();
    launch(x.device(), "batch_norm_backward", keep({x, gy, gamma, mean, invstd, gx, gg, gb}), [=](const LaunchCtx& c) {
      k::batch_norm16_backward(c.cpu, f, N, C, HW, X, GY, G, M, S, GX, GG, GB);
    });
    return std::vector<Tensor>{gx, gg, gb};
  });
  return y;
}

Tensor batch_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in, const Tensor& running_mean,
                  const Tensor& running_var, float momentum, float eps) {
  const Tensor x = autocast_input("batch_norm", x_in);
  const Tensor gamma = autocast_input("batch_norm", gamma_in);
  const Tensor beta = autocast_input("batch_norm", beta_in);
  Device d = same_device("batch_norm", {x, gamma, beta, running_mean, running_var});
  const bool h = in_16_bits("batch_norm", x);  // a 16-bit activation on a CPU device: x, y, dx in its type
  if (x.ndim() != 2 && x.ndim() != 4) fail("batch_norm", "x must be (N, C) or (N, C, H, W), got " + str(x.shape()));
  int64_t N = x.dim(0), C = x.dim(1), HW = x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1;
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var}) {
    if (t->shape() != Shape{C}) fail("batch_norm", "per-channel tensors must be (" + std::to_string(C) + "), got " + str(t->shape()));
    expect_f32("batch_norm", *t, "gamma, beta and the running statistics");
  }
  if (h) return batch_norm_16bit(x, gamma, beta, running_mean, running_var, momentum, eps);
  Tensor y = Tensor::empty(x.shape(), d);
  const float *X = x.data(), *G = gamma.data(), *B = beta.data();
  float *Y = y.data(), *RM = running_mean.data(), *RV = running_var.data();
  if (!is_training()) {
    launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_eval_forward, N, C, HW, X, G, B, RM, RV, eps, Y); });
    // Evaluation statistics are constants: y = gamma * (x - rm) / sqrt(rv + eps) + beta.
    record_evaluation(y, x, gamma, beta);
    return y;
  }
  if (N * HW < 2) fail("batch_norm", "training needs more than one value per channel, got " + str(x.shape()));
  Tensor mean = Tensor::empty({C}, d), invstd = Tensor::empty({C}, d);
  float *M = mean.data(), *S = invstd.data();
  launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y, mean, invstd}), [=](const LaunchCtx& c) {
    D2L_KERNEL(c, batch_norm_train_forward, N, C, HW, X, G, B, eps, momentum, Y, M, S, RM, RV);
  });
  record(y, "batch_norm", {x, gamma, beta}, [x, gamma, mean, invstd, N, C, HW](const Tensor& gy) {
    Tensor gx = Tensor::empty(x.shape(), x.device()), gg = Tensor::empty({C}, x.device()), gb = Tensor::empty({C}, x.device());
    const float *X = x.data(), *GY = gy.data(), *G = gamma.data(), *M = mean.data(), *S = invstd.data();
    float *GX = gx.data(), *GG = gg.data(), *GB = gb.data();
    launch(x.device(), "batch_norm_backward", keep({x, gy, gamma, mean, invstd, gx, gg, gb}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_backward, N, C, HW, X, GY, G, M, S, GX, GG, GB); });
    return std::vector<Tensor>{gx, gg, gb};
  });
  return y;
}

}  // namespace d2l
