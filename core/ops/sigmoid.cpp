// sigmoid: y = 1 / (1 + exp(-x)); dx = dy * y * (1 - y) (kernels/{cpu,cuda}/sigmoid).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor sigmoid(const Tensor& x) {
  return activation(
      "sigmoid", "sigmoid_backward", x, [](const Ctx& c, const float* X, float* Y, int64_t n) { D2L_KERNEL(c, sigmoid_forward, X, Y, n); },
      [](const Ctx& c, const float* Y, const float* G, float* GX, int64_t n) { D2L_KERNEL(c, sigmoid_backward, Y, G, GX, n); });
}

}  // namespace d2l
