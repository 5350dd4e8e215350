// conv2d: y = x * w (+ b), forward, backward-data and backward-weight (kernels/cpu/conv2d.cpp,
// kernels/cuda/conv2d.cu).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

// The float32 convolution's gradients: dL/dx (backward-data) and dL/dw (backward-weight), launched on
// x's device. gy, w, x float32 of the shapes s gives.
static Tensor conv2d_grad_x(const Tensor& w, const Tensor& gy, const Shape& x_shape, const k::Conv2dShape& s) {
  Tensor gx = Tensor::empty(x_shape, gy.device());
  const float *W = w.data(), *G = gy.data();
  float* GX = gx.data();
  launch(gy.device(), "conv2d_backward_data", keep({w, gy, gx}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, conv2d_backward_data, s, G, W, GX); });
  return gx;
}

static Tensor conv2d_grad_w(const Tensor& x, const Tensor& gy, const Shape& w_shape, const k::Conv2dShape& s) {
  Tensor gw = Tensor::empty(w_shape, x.device());
  const float *X = x.data(), *G = gy.data();
  float* GW = gw.data();
  launch(x.device(), "conv2d_backward_weight", keep({x, gy, gw}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, conv2d_backward_weight, s, X, G, GW); });
  return gw;
}

// The convolution's sizes, every operand checked (one line each).
static k::Conv2dShape conv2d_shape(const Tensor& x, const Tensor& w, Pair stride, Pair padding) {
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
  return s;
}

// 16-bit x and w (under Autocast, or given so): the portable way, as the CPU's gemm16 does it. Both are
// widened (exactly) and the float32 convolution runs (im2col's products of two 16-bit values are exact in
// float32, the sums are float32's), its result rounded once into their type; the bias is added after.
// The graph keeps the 16-bit operands only (the activations stored in 16 bits): backward widens them
// again, with the incoming gradient, for the float32 backward kernels, and rounds dL/dx and dL/dw once
// into the operands' type. The float32 copies live only while a kernel reads them. (zb-h1 cannot
// defer this dL/dw: its weight is autocast's 16-bit copy, not the parameter.)
static Tensor conv2d_16bit(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding) {
  if (!is_float(x.dtype()) || x.dtype() != w.dtype())
    fail("conv2d", std::string("x is ") + dtype_name(x.dtype()) + " and the weight " + dtype_name(w.dtype()) +
                       ": cast one to the other's type first");
  same_device("conv2d", {x, w});
  const k::Conv2dShape s = conv2d_shape(x, w, stride, padding);
  const DType t = x.dtype();
  Tensor y;
  {
    NoGrad no_grad;
    Autocast off(DType::f32);  // the float32 convolution inside is not cast back
    y = cast(conv2d(cast(x, DType::f32), cast(w, DType::f32), Tensor(), stride, padding), t);
  }
  record(y, "conv2d", {x, w}, [x, w, s, t](const Tensor& gy) {
    NoGrad no_grad;
    Autocast off(DType::f32);
    const Tensor gy32 = cast(gy, DType::f32);
    Tensor gx, gw;
    if (x.needs_grad()) gx = cast(conv2d_grad_x(cast(w, DType::f32), gy32, x.shape(), s), t);
    if (w.needs_grad()) gw = cast(conv2d_grad_w(cast(x, DType::f32), gy32, w.shape(), s), t);
    return std::vector<Tensor>{gx, gw};
  });
  return b.defined() ? bias_add(y, b) : y;
}

Tensor conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& b, Pair stride, Pair padding) {
  const Tensor x = autocast_input("conv2d", x_in);
  const Tensor w = autocast_input("conv2d", w_in);
  same_device("conv2d", {x, w});
  if (x.dtype() != DType::f32 || w.dtype() != DType::f32) return conv2d_16bit(x, w, b, stride, padding);
  Device d = same_device("conv2d", {x, w});
  expect_f32("conv2d", x, "x");
  const k::Conv2dShape s = conv2d_shape(x, w, stride, padding);
  Tensor y = Tensor::empty({s.N, s.OC, s.OH(), s.OW()}, d);
  const float *X = x.data(), *W = w.data();
  float* Y = y.data();
  launch(d, "conv2d", keep({x, w, y}), [=](const LaunchCtx& c) { D2L_KERNEL(c, conv2d_forward, s, X, W, Y); });
  record(y, "conv2d", {x, w}, [x, w, s](const Tensor& gy) {
    // (the network's input needs no dL/dx: its backward_data is skipped)
    Tensor gx = x.needs_grad() ? conv2d_grad_x(w, gy, x.shape(), s) : Tensor();
    auto weight_grad = [x, w, gy, s] { return conv2d_grad_w(x, gy, w.shape(), s); };
    if (defer_weight_grad(w, weight_grad)) return std::vector<Tensor>{gx, Tensor()};  // zb-h1's W, later
    return std::vector<Tensor>{gx, weight_grad()};
  });
  return b.defined() ? bias_add(y, b) : y;
}

}  // namespace d2l
