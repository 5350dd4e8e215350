// relu: y = max(x, 0); dx = dy where y > 0 (kernels/{cpu,cuda}/relu).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/relu.cpp, kernels/cuda/relu.cu), over flat arrays of n:
// y = max(x, 0); dx = dy * (x > 0) (y may stand for x: y > 0 exactly where x > 0).
D2L_DECLARE_KERNEL(relu_forward, const float* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(relu_backward, const float* x, const float* dy, float* dx, int64_t n);

namespace d2l {
using namespace detail;

Tensor relu(const Tensor& x) {
  return activation(
      "relu", "relu_backward", x,
      [](const LaunchCtx& c, const float* X, float* Y, int64_t n) { D2L_KERNEL(c, relu_forward, X, Y, n); },
      [](const LaunchCtx& c, const float* Y, const float* G, float* GX, int64_t n) { D2L_KERNEL(c, relu_backward, Y, G, GX, n); });
}

}  // namespace d2l
