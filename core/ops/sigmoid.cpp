// sigmoid: y = 1 / (1 + exp(-x)); dx = dy * y * (1 - y) (kernels/{cpu,cuda}/sigmoid).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels, on every backend (kernels/cpu/sigmoid.cpp, kernels/cuda/sigmoid.cu), over flat arrays of n:
// y = 1 / (1 + exp(-x)), stable for large |x|; the backward reads the output y: dx = dy * y * (1 - y).
D2L_DECLARE_KERNEL(sigmoid_forward, const float* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(sigmoid_backward, const float* y, const float* dy, float* dx, int64_t n);

namespace d2l {
using namespace detail;

Tensor sigmoid(const Tensor& x) {
  return activation(
      "sigmoid", "sigmoid_backward", x,
      [](const LaunchCtx& c, const float* X, float* Y, int64_t n) { D2L_KERNEL(c, sigmoid_forward, X, Y, n); },
      [](const LaunchCtx& c, const float* Y, const float* G, float* GX, int64_t n) { D2L_KERNEL(c, sigmoid_backward, Y, G, GX, n); });
}

}  // namespace d2l
