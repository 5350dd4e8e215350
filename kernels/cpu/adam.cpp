// adam_update: one step of PyTorch's Adam (torch.optim.Adam: weight decay added to the gradient, not
// AdamW's decoupled decay) over n parameters, in place on w, m (first moment) and v (second moment):
//   gi = grad_scale * g + wd * w
//   m  = beta1 * m + (1 - beta1) * gi
//   v  = beta2 * v + (1 - beta2) * gi * gi
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
// The caller gives step t's (t = 1, 2, ...) step_size = lr / (1 - beta1^t) and bc2_sqrt = sqrt(1 - beta2^t),
// so this is w -= lr * m_hat / (sqrt(v_hat) + eps), m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t),
// in PyTorch's order of operations.
// multi_adam_update: the same step on a list of count tensors, tensor t of n[t] elements (w[t], m[t], v[t], g[t]).
#include <cmath>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

void adam_update(const Ctx& c, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                 float beta1, float beta2, float eps, float step_size, float bc2_sqrt) {
  c.parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) {
      const float gi = grad_scale * g[i] + wd * w[i];
      m[i] = beta1 * m[i] + (1.0f - beta1) * gi;
      v[i] = beta2 * v[i] + (1.0f - beta2) * gi * gi;
      w[i] -= step_size * (m[i] / (std::sqrt(v[i]) / bc2_sqrt + eps));
    }
  });
}

// The CPU runs the list as one task on its stream: the kernel above, tensor after tensor.
void multi_adam_update(const Ctx& c, float* const* w, float* const* m, float* const* v, const float* const* g,
                       const int64_t* n, int64_t count, float grad_scale, float wd, float beta1, float beta2, float eps,
                       float step_size, float bc2_sqrt) {
  for (int64_t t = 0; t < count; ++t)
    adam_update(c, w[t], m[t], v[t], g[t], n[t], grad_scale, wd, beta1, beta2, eps, step_size, bc2_sqrt);
}

}  // namespace d2l::kernels::cpu
