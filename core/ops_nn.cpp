// conv2d, pooling and batch norm: shape checks, kernels on the device's stream, backward beside forward.
#include "core/ops_nn.hpp"

#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/ops_util.hpp"

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding) {
  Device d = same_device("conv2d", {x, w});
  expect_f32("conv2d", x, "x");
  expect_ndim("conv2d", x, 4, "x (N, C, H, W)");
  expect_ndim("conv2d", w, 4, "weight (OC, C, KH, KW)");
  if (w.dim(1) != x.dim(1))
    fail("conv2d", "weight " + str(w.shape()) + " expects " + std::to_string(w.dim(1)) + " input channels, x " +
                       str(x.shape()) + " has " + std::to_string(x.dim(1)));
  if (stride[0] < 1 || stride[1] < 1 || padding[0] < 0 || padding[1] < 0) fail("conv2d", "stride must be >= 1, padding >= 0");
  k::Conv2dShape s{x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2), w.dim(3),
                   stride[0], stride[1], padding[0], padding[1]};
  if (s.H + 2 * s.pad_h < s.KH || s.W + 2 * s.pad_w < s.KW)
    fail("conv2d", "kernel " + str(w.shape()) + " is larger than the padded input " + str(x.shape()));
  Tensor y = Tensor::empty({s.N, s.OC, s.OH(), s.OW()}, d);
  const float *X = x.data(), *W = w.data();
  float* Y = y.data();
  launch(d, "conv2d", keep({x, w, y}), [=](const k::Ctx& c) { D2L_KERNEL(c, conv2d_forward, s, X, W, Y); });
  record(y, "conv2d", {x, w}, [x, w, s](const Tensor& gy) {
    Tensor gx;
    if (x.needs_grad()) {  // (the network's input needs none: its backward_data is skipped)
      gx = Tensor::empty(x.shape(), x.device());
      const float *W = w.data(), *G = gy.data();
      float* GX = gx.data();
      launch(x.device(), "conv2d_backward_data", keep({w, gy, gx}),
             [=](const k::Ctx& c) { D2L_KERNEL(c, conv2d_backward_data, s, G, W, GX); });
    }
    auto weight_grad = [x, w, gy, s] {
      Tensor gw = Tensor::empty(w.shape(), w.device());
      const float *X = x.data(), *G = gy.data();
      float* GW = gw.data();
      launch(x.device(), "conv2d_backward_weight", keep({x, gy, gw}),
             [=](const k::Ctx& c) { D2L_KERNEL(c, conv2d_backward_weight, s, X, G, GW); });
      return gw;
    };
    if (defer_weight_grad(w, weight_grad)) return std::vector<Tensor>{gx, Tensor()};  // zb-h1's W, later
    return std::vector<Tensor>{gx, weight_grad()};
  });
  return b.defined() ? bias_add(y, b) : y;
}

static k::Pool2dShape pool_shape(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  expect_f32(op, x, "x");
  expect_ndim(op, x, 4, "x (N, C, H, W)");
  if (stride[0] == 0 && stride[1] == 0) stride = kernel;
  if (kernel[0] < 1 || kernel[1] < 1 || stride[0] < 1 || stride[1] < 1 || padding[0] < 0 || padding[1] < 0)
    fail(op, "kernel and stride must be >= 1, padding >= 0");
  if (padding[0] * 2 > kernel[0] || padding[1] * 2 > kernel[1]) fail(op, "padding must be at most half the window");
  k::Pool2dShape s{x.dim(0), x.dim(1), x.dim(2), x.dim(3), kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1]};
  if (s.H + 2 * s.pad_h < s.KH || s.W + 2 * s.pad_w < s.KW)
    fail(op, "window larger than the padded input " + str(x.shape()));
  return s;
}

Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  k::Pool2dShape s = pool_shape("max_pool2d", x, kernel, stride, padding);
  Device d = x.device();
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()}, d);
  Tensor arg = Tensor::empty(y.shape(), d, DType::i32);  // where each maximum came from
  const float* X = x.data();
  float* Y = y.data();
  int32_t* A = arg.labels();
  launch(d, "max_pool2d", keep({x, y, arg}), [=](const k::Ctx& c) { D2L_KERNEL(c, max_pool2d_forward, s, X, Y, A); });
  record(y, "max_pool2d", {x}, [arg, s](const Tensor& gy) {
    Tensor gx = Tensor::empty({s.N, s.C, s.H, s.W}, gy.device());
    const float* G = gy.data();
    const int32_t* A = arg.labels();
    float* GX = gx.data();
    launch(gy.device(), "max_pool2d_backward", keep({arg, gy, gx}), [=](const k::Ctx& c) { D2L_KERNEL(c, max_pool2d_backward, s, G, A, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride, Pair padding) {
  k::Pool2dShape s = pool_shape("avg_pool2d", x, kernel, stride, padding);
  Device d = x.device();
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()}, d);
  const float* X = x.data();
  float* Y = y.data();
  launch(d, "avg_pool2d", keep({x, y}), [=](const k::Ctx& c) { D2L_KERNEL(c, avg_pool2d_forward, s, X, Y); });
  record(y, "avg_pool2d", {x}, [s](const Tensor& gy) {
    Tensor gx = Tensor::empty({s.N, s.C, s.H, s.W}, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "avg_pool2d_backward", keep({gy, gx}), [=](const k::Ctx& c) { D2L_KERNEL(c, avg_pool2d_backward, s, G, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor global_avg_pool2d(const Tensor& x) {
  expect_f32("global_avg_pool2d", x, "x");
  expect_ndim("global_avg_pool2d", x, 4, "x (N, C, H, W)");
  int64_t N = x.dim(0), C = x.dim(1), HW = x.dim(2) * x.dim(3);
  Device d = x.device();
  Tensor y = Tensor::empty({N, C, 1, 1}, d);
  const float* X = x.data();
  float* Y = y.data();
  launch(d, "global_avg_pool2d", keep({x, y}), [=](const k::Ctx& c) { D2L_KERNEL(c, global_avg_pool_forward, N, C, HW, X, Y); });
  Shape shape = x.shape();
  record(y, "global_avg_pool2d", {x}, [shape, N, C, HW](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "global_avg_pool2d_backward", keep({gy, gx}),
           [=](const k::Ctx& c) { D2L_KERNEL(c, global_avg_pool_backward, N, C, HW, G, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, float momentum, float eps) {
  Device d = same_device("batch_norm", {x, gamma, beta, running_mean, running_var});
  expect_f32("batch_norm", x, "x");
  if (x.ndim() != 2 && x.ndim() != 4) fail("batch_norm", "x must be (N, C) or (N, C, H, W), got " + str(x.shape()));
  int64_t N = x.dim(0), C = x.dim(1), HW = x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1;
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var})
    if (t->shape() != Shape{C}) fail("batch_norm", "per-channel tensors must be (" + std::to_string(C) + "), got " + str(t->shape()));
  Tensor y = Tensor::empty(x.shape(), d);
  const float *X = x.data(), *G = gamma.data(), *B = beta.data();
  float *Y = y.data(), *RM = running_mean.data(), *RV = running_var.data();
  if (!is_training()) {
    launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y}),
           [=](const k::Ctx& c) { D2L_KERNEL(c, batch_norm_eval_forward, N, C, HW, X, G, B, RM, RV, eps, Y); });
    // Evaluation statistics are constants: y = gamma * (x - rm) / sqrt(rv + eps) + beta.
    record(y, "batch_norm", {x, gamma, beta}, [](const Tensor&) -> std::vector<Tensor> {
      throw std::logic_error("batch_norm: backward in evaluation mode is not supported; train with TrainMode(true)");
    });
    return y;
  }
  if (N * HW < 2) fail("batch_norm", "training needs more than one value per channel, got " + str(x.shape()));
  Tensor mean = Tensor::empty({C}, d), invstd = Tensor::empty({C}, d);
  float *M = mean.data(), *S = invstd.data();
  launch(d, "batch_norm", keep({x, gamma, beta, running_mean, running_var, y, mean, invstd}), [=](const k::Ctx& c) {
    D2L_KERNEL(c, batch_norm_train_forward, N, C, HW, X, G, B, eps, momentum, Y, M, S, RM, RV);
  });
  record(y, "batch_norm", {x, gamma, beta}, [x, gamma, mean, invstd, N, C, HW](const Tensor& gy) {
    Tensor gx = Tensor::empty(x.shape(), x.device()), gg = Tensor::empty({C}, x.device()), gb = Tensor::empty({C}, x.device());
    const float *X = x.data(), *GY = gy.data(), *G = gamma.data(), *M = mean.data(), *S = invstd.data();
    float *GX = gx.data(), *GG = gg.data(), *GB = gb.data();
    launch(x.device(), "batch_norm_backward", keep({x, gy, gamma, mean, invstd, gx, gg, gb}),
           [=](const k::Ctx& c) { D2L_KERNEL(c, batch_norm_backward, N, C, HW, X, GY, G, M, S, GX, GG, GB); });
    return std::vector<Tensor>{gx, gg, gb};
  });
  return y;
}

}  // namespace d2l
