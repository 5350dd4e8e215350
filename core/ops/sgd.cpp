// sgd_update_: w -= lr * g, in place; multi_sgd_mom_update_: the Trainer's SGD on a list of tensors in one
// launch (kernels/{cpu,cuda}/sgd).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/sgd.cpp, kernels/cuda/sgd.cu), over flat arrays of n:
// w -= lr * g (the book's sgd: param[:] = param - lr * grad / batch_size, lr pre-divided).
D2L_DECLARE_KERNEL(sgd_update, float* w, const float* g, int64_t n, float lr);
// For each of count tensors t (n[t] elements): mom = momentum * mom + decay * w + grad_scale * g; w += mom,
// rounded as scale_ then three add_ round it.
D2L_DECLARE_KERNEL(multi_sgd_mom_update, float* const* w, float* const* mom, const float* const* g, const int64_t* n,
                   int64_t count, float momentum, float decay, float grad_scale);

namespace d2l {
using namespace detail;

void sgd_update_(const Tensor& w, const Tensor& g, float lr) {
  check_elementwise("sgd_update", {w, g});
  run("sgd_update", {w, g}, [=, W = w.data(), G = g.data(), n = w.numel()](const LaunchCtx& c) { D2L_KERNEL(c, sgd_update, W, G, n, lr); });
}

void multi_sgd_mom_update_(const std::vector<Tensor>& w, const std::vector<Tensor>& mom, const std::vector<Tensor>& g,
                           float momentum, float decay, float grad_scale) {
  const char* op = "multi_sgd_mom_update";
  TensorLists l = tensor_lists(op, {&w, &mom, &g});
  for (size_t t = 0; t < w.size(); ++t)
    if (w[t].same(mom[t])) fail(op, "w and mom must be two tensors");
  if (w.empty()) return;
  const Device d = l.device;
  // The storages go to launch (which keeps those of other streams), not into the kernel's closure:
  // a buffer the host lets go of is free for its own stream's later work at once, as for every op.
  std::vector<std::shared_ptr<Storage>> keep = std::move(l.keep);
  launch(d, op, std::move(keep), [=, l = std::move(l)](const LaunchCtx& c) {
    const int64_t count = static_cast<int64_t>(l.n.size());
    D2L_KERNEL(c, multi_sgd_mom_update, l.ptr[0].data(), l.ptr[1].data(), l.ptr[2].data(), l.n.data(), count,
               momentum, decay, grad_scale);
  });
}

}  // namespace d2l
