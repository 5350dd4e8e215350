// relu: y = max(x, 0); dx = dy where y > 0 (kernels/{cpu,cuda}/relu).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor relu(const Tensor& x) {
  return activation(
      "relu", "relu_backward", x, [](const Ctx& c, const float* X, float* Y, int64_t n) { D2L_KERNEL(c, relu_forward, X, Y, n); },
      [](const Ctx& c, const float* Y, const float* G, float* GX, int64_t n) { D2L_KERNEL(c, relu_backward, Y, G, GX, n); });
}

}  // namespace d2l
