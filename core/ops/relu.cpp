// relu: y = max(x, 0); dx = dy where y > 0 (kernels/{cpu,cuda}/relu).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/relu.cpp, kernels/cuda/relu.cu), over flat arrays of n:
// y = max(x, 0); dx = dy * (x > 0) (y may stand for x: y > 0 exactly where x > 0).
D2L_DECLARE_KERNEL(relu_forward, const float* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(relu_backward, const float* x, const float* dy, float* dx, int64_t n);

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

// A 16-bit x on a CPU device (autocast's activations there): the same two kernels over 16-bit bits
// (kernels/cpu's relu16_*), y and the gradients in x's type; backward keeps y's memory, as below.
static Tensor relu_16bit(const Tensor& x) {
  const DType t = x.dtype();
  const k::Float16 f = float16_of(t);
  const int64_t n = x.numel();
  Tensor y = Tensor::empty(x.shape(), x.device(), t);
  run("relu", {x, y}, [=, X = x.data16(), Y = y.data16()](const LaunchCtx& c) { k::relu16_forward(c.cpu, f, X, Y, n); });
  record(y, "relu", {x}, [=, ys = y.storage(), shape = x.shape()](const Tensor& gy_in) {
    const Tensor gy = cast(gy_in, t);
    Tensor gx = Tensor::empty(shape, gy.device(), t);
    const uint16_t *Y = static_cast<const uint16_t*>(ys->ptr), *G = gy.data16();
    uint16_t* GX = gx.data16();
    launch(gy.device(), "relu_backward", {ys, gy.storage(), gx.storage()},
           [=](const LaunchCtx& c) { k::relu16_backward(c.cpu, f, Y, G, GX, n); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor relu(const Tensor& x_in) {
  const Tensor x = autocast_input("relu", x_in);
  if (in_16_bits("relu", x)) return relu_16bit(x);
  return activation(
      "relu", "relu_backward", x,
      [](const LaunchCtx& c, const float* X, float* Y, int64_t n) { D2L_KERNEL(c, relu_forward, X, Y, n); },
      [](const LaunchCtx& c, const float* Y, const float* G, float* GX, int64_t n) { D2L_KERNEL(c, relu_backward, Y, G, GX, n); });
}

}  // namespace d2l
