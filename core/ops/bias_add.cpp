// bias_add: x (N, C, ...) + b (C), forward and backward (kernels/{cpu,cuda}/bias_add).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor bias_add(const Tensor& x_in, const Tensor& b_in) {
  const Tensor x = autocast_input("bias_add", x_in);
  const Tensor b = autocast_input("bias_add", b_in);
  Device d = same_device("bias_add", {x, b});
  const bool h = in_16_bits("bias_add", x);  // a 16-bit activation on a CPU device: x, y, dx in its type
  expect_f32("bias_add", b, "bias");
  if (x.ndim() < 2) fail("bias_add", "x must be (N, C, ...), got shape " + str(x.shape()));
  expect_ndim("bias_add", b, 1, "bias");
  int64_t outer = x.dim(0), C = x.dim(1), inner = x.numel() / std::max<int64_t>(1, outer * C);
  if (b.dim(0) != C) fail("bias_add", "bias " + str(b.shape()) + " does not match the C of x " + str(x.shape()));
  if (outer * C == 0) inner = 0;
  if (h) {
    const DType t = x.dtype();
    const kernels::cpu::Float16 f = float16_of(t);
    Tensor y = Tensor::empty(x.shape(), d, t);
    const uint16_t* X = x.data16();
    const float* Bp = b.data();
    uint16_t* Y = y.data16();
    launch(d, "bias_add", keep({x, b, y}),
           [=](const LaunchCtx& c) { kernels::cpu::bias_add16_forward(c.cpu, f, X, Bp, Y, outer, C, inner); });
    record(y, "bias_add", {x, b}, [outer, C, inner, t, f](const Tensor& gy_in) {
      const Tensor gy = cast(gy_in, t);
      Tensor gb = Tensor::empty({C}, gy.device());
      const uint16_t* G = gy.data16();
      float* GB = gb.data();
      launch(gy.device(), "bias_add_backward", keep({gy, gb}),
             [=](const LaunchCtx& c) { kernels::cpu::bias_add16_backward(c.cpu, f, G, GB, outer, C, inner); });
      return std::vector<Tensor>{gy, gb};
    });
    return y;
  }
  Tensor y = Tensor::empty(x.shape(), d);
  const float *X = x.data(), *Bp = b.data();
  float* Y = y.data();
  launch(d, "bias_add", keep({x, b, y}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, bias_add_forward, X, Bp, Y, outer, C, inner); });
  record(y, "bias_add", {x, b}, [outer, C, inner](const Tensor& gy) {
    Tensor gb = Tensor::empty({C}, gy.device());
    const float* G = gy.data();
    float* GB = gb.data();
    launch(gy.device(), "bias_add_backward", keep({gy, gb}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, bias_add_backward, G, GB, outer, C, inner); });
    return std::vector<Tensor>{gy, gb};
  });
  return y;
}

}  // namespace d2l
