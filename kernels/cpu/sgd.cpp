// sgd_update: w[i] -= lr * g[i] for i < n (lr already divided by the batch size by the caller).
// multi_sgd_mom_update: MXNet's SGD with momentum and weight decay (the Trainer's "sgd") on a list of
// count tensors, tensor t of n[t] elements, in place on w[t] and mom[t]:
//   mom = momentum * mom + decay * w + grad_scale * g      (decay = -lr * wd, grad_scale = -lr / batch_size)
//   w  += mom
// computed as the per-tensor step's four kernels compute it (core/optim/kvstore.cpp sgd_step: scale, then
// axpy three times), each result stored as a float.
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void sgd_update(const Ctx& c, float* w, const float* g, int64_t n, float lr) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] -= lr * g[i];
  });
}

// The CPU runs the list as one task on its stream: the per-tensor step's kernels, tensor after tensor.
void multi_sgd_mom_update(const Ctx& c, float* const* w, float* const* mom, const float* const* g, const int64_t* n,
                          int64_t count, float momentum, float decay, float grad_scale) {
  for (int64_t t = 0; t < count; ++t) {
    scale(c, mom[t], mom[t], n[t], momentum);
    axpy(c, decay, w[t], mom[t], n[t]);
    axpy(c, grad_scale, g[t], mom[t], n[t]);
    axpy(c, 1.0f, mom[t], w[t], n[t]);
  }
}

}  // namespace d2l::kernels::cpu
