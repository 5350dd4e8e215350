// adam_update_: one step of PyTorch's Adam on w, m, v in place (kernels/{cpu,cuda}/adam).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/adam.cpp, kernels/cuda/adam.cu), over flat arrays of n:
//   gi = grad_scale * g + wd * w;  m = beta1 * m + (1 - beta1) * gi;  v = beta2 * v + (1 - beta2) * gi * gi;
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
D2L_DECLARE_KERNEL(adam_update, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                   float beta1, float beta2, float eps, float step_size, float bc2_sqrt);

namespace d2l {
using namespace detail;

void adam_update_(const Tensor& w, const Tensor& m, const Tensor& v, const Tensor& g, const AdamStep& s) {
  check_elementwise("adam_update", {w, m, v, g});
  if (w.same(m) || w.same(v) || m.same(v)) fail("adam_update", "w, m and v must be three tensors");
  run("adam_update", {w, m, v, g},
      [=, W = w.data(), M = m.data(), V = v.data(), G = g.data(), n = w.numel()](const LaunchCtx& c) {
        D2L_KERNEL(c, adam_update, W, M, V, G, n, s.grad_scale, s.wd, s.beta1, s.beta2, s.epsilon, s.step_size,
                   s.bias_correction2_sqrt);
      });
}

}  // namespace d2l
