// sgd_update_: w -= lr * g, in place (kernels/{cpu,cuda}/sgd).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

void sgd_update_(const Tensor& w, const Tensor& g, float lr) {
  Device d = same_device("sgd_update", {w, g});
  expect_same_shape("sgd_update", w, g);
  float* W = w.data();
  const float* G = g.data();
  int64_t n = w.numel();
  launch(d, "sgd_update", keep({w, g}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, sgd_update, W, G, n, lr); });
}

}  // namespace d2l
