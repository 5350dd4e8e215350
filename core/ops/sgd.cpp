// sgd_update_: w -= lr * g, in place (kernels/{cpu,cuda}/sgd).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/sgd.cpp, kernels/cuda/sgd.cu), over flat arrays of n:
// w -= lr * g (the book's sgd: param[:] = param - lr * grad / batch_size, lr pre-divided).
D2L_DECLARE_KERNEL(sgd_update, float* w, const float* g, int64_t n, float lr);

namespace d2l {
using namespace detail;

void sgd_update_(const Tensor& w, const Tensor& g, float lr) {
  check_elementwise("sgd_update", {w, g});
  run("sgd_update", {w, g}, [=, W = w.data(), G = g.data(), n = w.numel()](const LaunchCtx& c) { D2L_KERNEL(c, sgd_update, W, G, n, lr); });
}

}  // namespace d2l
