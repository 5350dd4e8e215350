// relu: y = max(x, 0), forward and backward (kernels/{cpu,cuda}/relu).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor relu(const Tensor& x) {
  Tensor y = elementwise_output("relu", {x});
  const Device d = y.device();
  const int64_t n = x.numel();
  run("relu", {x, y}, [X = x.data(), Y = y.data(), n](const Ctx& c) { D2L_KERNEL(c, relu_forward, X, Y, n); });
  // The backward needs only where y > 0 (the same places as x > 0), so it keeps y's memory, not x's:
  // x, often a BatchNorm output nothing else keeps, is then freed (PyTorch's ReLU(inplace=True) saves
  // the same). Holding y's storage, not y, keeps y's graph node out of its own closure.
  record(y, "relu", {x}, [ys = y.storage(), shape = x.shape(), d, n](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, d);
    const float *Y = static_cast<const float*>(ys->ptr), *G = gy.data();
    float* GX = gx.data();
    launch(d, "relu_backward", {ys, gy.storage(), gx.storage()},
           [=](const Ctx& c) { D2L_KERNEL(c, relu_backward, Y, G, GX, n); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace d2l
