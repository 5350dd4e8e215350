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

// The three passes on 16-bit operands on cpu(i) (kernels/cpu's conv2d16_*: im2col in 16 bits and
// gemm16, float32 sums): y and dL/dx in x's type t (each sum rounded once), dL/dw float32. x, w and gy
// of type t.
static Tensor conv2d16_y(const Tensor& x, const Tensor& w, const k::Conv2dShape& s) {
  Tensor y = Tensor::empty({s.N, s.OC, s.OH(), s.OW()}, x.device(), x.dtype());
  const uint16_t *X = x.data16(), *W = w.data16();
  uint16_t* Y = y.data16();
  const k::Float16 f = float16_of(x.dtype());
  launch(x.device(), "conv2d", keep({x, w, y}), [=](const LaunchCtx& c) { k::conv2d16_forward(c.cpu, f, s, X, W, Y); });
  return y;
}
static Tensor conv2d16_grad_x(const Tensor& w, const Tensor& gy, const Shape& x_shape, const k::Conv2dShape& s) {
  Tensor gx = Tensor::empty(x_shape, gy.device(), w.dtype());
  const uint16_t *W = w.data16(), *G = gy.data16();
  uint16_t* GX = gx.data16();
  const k::Float16 f = float16_of(w.dtype());
  launch(gy.device(), "conv2d_backward_data", keep({w, gy, gx}),
         [=](const LaunchCtx& c) { k::conv2d16_backward_data(c.cpu, f, s, G, W, GX); });
  return gx;
}
static Tensor conv2d16_grad_w(const Tensor& x, const Tensor& gy, const Shape& w_shape, const k::Conv2dShape& s) {
  Tensor gw = Tensor::empty(w_shape, x.device());
  const uint16_t *X = x.data16(), *G = gy.data16();
  float* GW = gw.data();
  const k::Float16 f = float16_of(x.dtype());
  launch(x.device(), "conv2d_backward_weight", keep({x, gy, gw}),
         [=](const LaunchCtx& c) { k::conv2d16_backward_weight(c.cpu, f, s, X, G, GW); });
  return gw;
}

// 16-bit x and w (under Autocast, or given so): float32 sums of the exact products of the 16-bit
// values, rounded once into their type; the bias is added after. bfloat16 on cpu(i) with AVX512-BF16
// runs the 16-bit passes above (whatever --conv chose for float32: they are kernel2's, on VDPBF16PS),
// which write y and dL/dx in 16 bits themselves.
// Elsewhere (float16, emu(i), gpu(i), a CPU without the instruction) the portable way, as the CPU's
// gemm16_widened does it: both operands widened (exactly) and the float32 convolution run. The graph
// keeps the 16-bit operands only (the activations stored in 16 bits): backward takes them with the
// incoming gradient in 16 bits too (widened, on the portable way) and rounds dL/dx and dL/dw once into
// the operands' type. Float32 copies (the portable way's) live only while a kernel reads
// them. (zb-h1 cannot defer this dL/dw: its weight is autocast's 16-bit copy, not the parameter.)
static Tensor conv2d_16bit(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride, Pair padding) {
  if (!is_float(x.dtype()) || x.dtype() != w.dtype())
    fail("conv2d", std::string("x is ") + dtype_name(x.dtype()) + " and the weight " + dtype_name(w.dtype()) +
                       ": cast one to the other's type first");
  same_device("conv2d", {x, w});
  const k::Conv2dShape s = conv2d_shape(x, w, stride, padding);
  const DType t = x.dtype();
  // bfloat16 on a CPU with VDPBF16PS: the 16-bit passes (faster than widening there: bench/README.md)
  const bool in_16_bits = x.device().kind == DeviceKind::cpu && t == DType::bf16 && k::has_avx512_bf16();
  Tensor y;
  {
    NoGrad no_grad;
    Autocast off(DType::f32);  // the float32 convolution inside is not cast back
    y = in_16_bits ? conv2d16_y(x, w, s) : cast(conv2d(cast(x, DType::f32), cast(w, DType::f32), Tensor(), stride, padding), t);
  }
  record(y, "conv2d", {x, w}, [x, w, s, t, in_16_bits](const Tensor& gy) {
    NoGrad no_grad;
    Autocast off(DType::f32);
    Tensor gx, gw;
    if (in_16_bits) {
      const Tensor g16 = cast(gy, t);
      if (x.needs_grad()) gx = conv2d16_grad_x(w, g16, x.shape(), s);
      if (w.needs_grad()) gw = cast(conv2d16_grad_w(x, g16, w.shape(), s), t);
    } else {
      const Tensor gy32 = cast(gy, DType::f32);
      if (x.needs_grad()) gx = cast(conv2d_grad_x(cast(w, DType::f32), gy32, x.shape(), s), t);
      if (w.needs_grad()) gw = cast(conv2d_grad_w(cast(x, DType::f32), gy32, w.shape(), s), t);
    }
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
