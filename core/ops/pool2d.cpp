// max_pool2d, avg_pool2d, global_avg_pool2d (kernels/{cpu,cuda}/pool2d).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/pool2d.cpp, kernels/cuda/pool2d.cu): x (N, C, H, W) -> y (N, C, OH, OW)
// (Pool2dShape, kernels/cpu/kernels.hpp). Padding never wins a max; max keeps argmax (flat h*W + w in
// its plane); average divides by KH*KW (padding counted, as PyTorch's and MXNet's defaults). Global
// average pool: x (N, C, HW) -> y (N, C). dx overwritten.
D2L_DECLARE_KERNEL(max_pool2d_forward, const Pool2dShape& s, const float* x, float* y, int32_t* argmax);
D2L_DECLARE_KERNEL(max_pool2d_backward, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx);
D2L_DECLARE_KERNEL(avg_pool2d_forward, const Pool2dShape& s, const float* x, float* y);
D2L_DECLARE_KERNEL(avg_pool2d_backward, const Pool2dShape& s, const float* dy, float* dx);
D2L_DECLARE_KERNEL(global_avg_pool_forward, int64_t N, int64_t C, int64_t HW, const float* x, float* y);
D2L_DECLARE_KERNEL(global_avg_pool_backward, int64_t N, int64_t C, int64_t HW, const float* dy, float* dx);

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

static k::Pool2dShape pool_shape(const char* op, const Tensor& x, Pair kernel, Pair stride, Pair padding) {
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

// max-pooling of a 16-bit x on a CPU device (autocast's activations there): kernels/cpu's
// max_pool2d16_*, y and the gradient in x's type.
static Tensor max_pool2d_16bit(const Tensor& x, const k::Pool2dShape& s) {
  const DType t = x.dtype();
  const k::Float16 f = float16_of(t);
  Device d = x.device();
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()}, d, t);
  Tensor arg = Tensor::empty(y.shape(), d, DType::i32);
  const uint16_t* X = x.data16();
  uint16_t* Y = y.data16();
  int32_t* A = arg.labels();
  launch(d, "max_pool2d", keep({x, y, arg}), [=](const LaunchCtx& c) { k::max_pool2d16_forward(c.cpu, f, s, X, Y, A); });
  record(y, "max_pool2d", {x}, [arg, s, t, f](const Tensor& gy_in) {
    const Tensor gy = cast(gy_in, t);
    Tensor gx = Tensor::empty({s.N, s.C, s.H, s.W}, gy.device(), t);
    const uint16_t* G = gy.data16();
    const int32_t* A = arg.labels();
    uint16_t* GX = gx.data16();
    launch(gy.device(), "max_pool2d_backward", keep({arg, gy, gx}),
           [=](const LaunchCtx& c) { k::max_pool2d16_backward(c.cpu, f, s, G, A, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor max_pool2d(const Tensor& x_in, Pair kernel, Pair stride, Pair padding) {
  const Tensor x = autocast_input("max_pool2d", x_in);
  k::Pool2dShape s = pool_shape("max_pool2d", x, kernel, stride, padding);
  if (in_16_bits("max_pool2d", x)) return max_pool2d_16bit(x, s);
  Device d = x.device();
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()}, d);
  Tensor arg = Tensor::empty(y.shape(), d, DType::i32);  // where each maximum came from
  const float* X = x.data();
  float* Y = y.data();
  int32_t* A = arg.labels();
  launch(d, "max_pool2d", keep({x, y, arg}), [=](const LaunchCtx& c) { D2L_KERNEL(c, max_pool2d_forward, s, X, Y, A); });
  record(y, "max_pool2d", {x}, [arg, s](const Tensor& gy) {
    Tensor gx = Tensor::empty({s.N, s.C, s.H, s.W}, gy.device());
    const float* G = gy.data();
    const int32_t* A = arg.labels();
    float* GX = gx.data();
    launch(gy.device(), "max_pool2d_backward", keep({arg, gy, gx}), [=](const LaunchCtx& c) { D2L_KERNEL(c, max_pool2d_backward, s, G, A, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor avg_pool2d(const Tensor& x_in, Pair kernel, Pair stride, Pair padding) {
  const Tensor x = autocast_input("avg_pool2d", x_in);
  expect_f32("avg_pool2d", x, "x");
  k::Pool2dShape s = pool_shape("avg_pool2d", x, kernel, stride, padding);
  Device d = x.device();
  Tensor y = Tensor::empty({s.N, s.C, s.OH(), s.OW()}, d);
  const float* X = x.data();
  float* Y = y.data();
  launch(d, "avg_pool2d", keep({x, y}), [=](const LaunchCtx& c) { D2L_KERNEL(c, avg_pool2d_forward, s, X, Y); });
  record(y, "avg_pool2d", {x}, [s](const Tensor& gy) {
    Tensor gx = Tensor::empty({s.N, s.C, s.H, s.W}, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "avg_pool2d_backward", keep({gy, gx}), [=](const LaunchCtx& c) { D2L_KERNEL(c, avg_pool2d_backward, s, G, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor global_avg_pool2d(const Tensor& x_in) {
  const Tensor x = autocast_input("global_avg_pool2d", x_in);
  expect_f32("global_avg_pool2d", x, "x");
  expect_ndim("global_avg_pool2d", x, 4, "x (N, C, H, W)");
  int64_t N = x.dim(0), C = x.dim(1), HW = x.dim(2) * x.dim(3);
  Device d = x.device();
  Tensor y = Tensor::empty({N, C, 1, 1}, d);
  const float* X = x.data();
  float* Y = y.data();
  launch(d, "global_avg_pool2d", keep({x, y}), [=](const LaunchCtx& c) { D2L_KERNEL(c, global_avg_pool_forward, N, C, HW, X, Y); });
  Shape shape = x.shape();
  record(y, "global_avg_pool2d", {x}, [shape, N, C, HW](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "global_avg_pool2d_backward", keep({gy, gx}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, global_avg_pool_backward, N, C, HW, G, GX); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace d2l
