// adam_update_: one step of PyTorch's Adam on w, m, v in place; multi_adam_update_: the same on a list of
// tensors in one launch (kernels/{cpu,cuda}/adam).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/adam.cpp, kernels/cuda/adam.cu), over flat arrays of n:
//   gi = grad_scale * g + wd * w;  m = beta1 * m + (1 - beta1) * gi;  v = beta2 * v + (1 - beta2) * gi * gi;
//   w -= step_size * (m / (sqrt(v) / bc2_sqrt + eps))
D2L_DECLARE_KERNEL(adam_update, float* w, float* m, float* v, const float* g, int64_t n, float grad_scale, float wd,
                   float beta1, float beta2, float eps, float step_size, float bc2_sqrt);
// The same for each of count tensors t (n[t] elements): the bits adam_update gives tensor t.
D2L_DECLARE_KERNEL(multi_adam_update, float* const* w, float* const* m, float* const* v, const float* const* g,
                   const int64_t* n, int64_t count, float grad_scale, float wd, float beta1, float beta2, float eps,
                   float step_size, float bc2_sqrt);

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

void multi_adam_update_(const std::vector<Tensor>& w, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                        const std::vector<Tensor>& g, const AdamStep& s) {
  const char* op = "multi_adam_update";
  TensorLists l = tensor_lists(op, {&w, &m, &v, &g});
  for (size_t t = 0; t < w.size(); ++t)
    if (w[t].same(m[t]) || w[t].same(v[t]) || m[t].same(v[t])) fail(op, "w, m and v must be three tensors");
  if (w.empty()) return;
  const Device d = l.device;
  // The storages go to launch (which keeps those of other streams), not into the kernel's closure:
  // a buffer the host lets go of is free for its own stream's later work at once, as for every op.
  std::vector<std::shared_ptr<Storage>> keep = std::move(l.keep);
  launch(d, op, std::move(keep), [=, l = std::move(l)](const LaunchCtx& c) {
    const int64_t count = static_cast<int64_t>(l.n.size());
    D2L_KERNEL(c, multi_adam_update, l.ptr[0].data(), l.ptr[1].data(), l.ptr[2].data(), l.ptr[3].data(), l.n.data(),
               count, s.grad_scale, s.wd, s.beta1, s.beta2, s.epsilon, s.step_size, s.bias_correction2_sqrt);
  });
}

}  // namespace d2l
