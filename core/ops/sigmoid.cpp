// sigmoid: y = 1 / (1 + exp(-x)), forward and backward (kernels/{cpu,cuda}/sigmoid).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor sigmoid(const Tensor& x) {
  Device d = same_device("sigmoid", {x});
  expect_f32("sigmoid", x, "x");
  Tensor y = Tensor::empty(x.shape(), d);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "sigmoid", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, sigmoid_forward, X, Y, n); });
  // dx = dy * y * (1 - y) needs only y: the backward keeps y's memory, not x's, as relu's does.
  // Holding y's storage, not y, keeps y's graph node out of its own closure.
  record(y, "sigmoid", {x}, [ys = y.storage(), shape = x.shape(), d, n](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, d);
    const float *Y = static_cast<const float*>(ys->ptr), *G = gy.data();
    float* GX = gx.data();
    launch(d, "sigmoid_backward", {ys, gy.storage(), gx.storage()},
           [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, sigmoid_backward, Y, G, GX, n); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace d2l
