// sgd_update_: w -= lr * g, in place (kernels/{cpu,cuda}/sgd).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

void sgd_update_(const Tensor& w, const Tensor& g, float lr) {
  elementwise_output("sgd_update", {w, g});  // the checks
  run("sgd_update", {w, g}, [=, W = w.data(), G = g.data(), n = w.numel()](const Ctx& c) { D2L_KERNEL(c, sgd_update, W, G, n, lr); });
}

}  // namespace d2l
