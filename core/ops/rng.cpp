// normal and uniform: element i of a draw is Philox(seed, offset + i) on every device
// (kernels/{cpu,cuda}/rng; the seed and the offsets are core/rng.hpp's).
#include "core/ops.hpp"
#include "core/ops/op.hpp"
#include "core/rng.hpp"

namespace d2l {
using namespace detail;

namespace {
// The next draw of x.numel() values: the current seed, and the offset this draw takes.
struct Draw {
  uint64_t seed, offset;
};
Draw next_draw(const Tensor& x) { return {current_seed(), take_offset(static_cast<uint64_t>(x.numel()))}; }
}  // namespace

Tensor normal(const Shape& shape, float mean, float stddev, Device d) {
  Tensor x = Tensor::empty(shape, d);
  run("normal", {x}, [=, X = x.data(), n = x.numel(), r = next_draw(x)](const LaunchCtx& c) {
    D2L_KERNEL(c, normal, X, n, r.seed, r.offset, mean, stddev);
  });
  return x;
}

Tensor uniform(const Shape& shape, float lo, float hi, Device d) {
  if (!(lo < hi)) fail("uniform", "needs lo < hi");
  Tensor x = Tensor::empty(shape, d);
  run("uniform", {x}, [=, X = x.data(), n = x.numel(), r = next_draw(x)](const LaunchCtx& c) {
    D2L_KERNEL(c, uniform, X, n, r.seed, r.offset, lo, hi);
  });
  return x;
}

}  // namespace d2l
