// normal and uniform: element i of a draw is Philox(seed, offset + i) on every device (kernels/{cpu,cuda}/rng;
// the seed and offsets are core/rng.hpp's).
#include "core/ops.hpp"
#include "core/ops/op.hpp"
#include "core/rng.hpp"

namespace d2l {
using namespace detail;

// ---- random: element i of this draw is Philox(seed, offset + i) on every device.
Tensor normal(const Shape& shape, float mean, float stddev, Device d) {
  Tensor x = Tensor::empty(shape, d);
  float* X = x.data();
  int64_t n = x.numel();
  uint64_t seed = current_seed(), offset = take_offset(static_cast<uint64_t>(n));
  launch(d, "normal", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, normal, X, n, seed, offset, mean, stddev); });
  return x;
}

Tensor uniform(const Shape& shape, float lo, float hi, Device d) {
  if (!(lo < hi)) fail("uniform", "needs lo < hi");
  Tensor x = Tensor::empty(shape, d);
  float* X = x.data();
  int64_t n = x.numel();
  uint64_t seed = current_seed(), offset = take_offset(static_cast<uint64_t>(n));
  launch(d, "uniform", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, uniform, X, n, seed, offset, lo, hi); });
  return x;
}

}  // namespace d2l
