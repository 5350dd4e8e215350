// fill_, scale and scale_ (kernels/{cpu,cuda}/fill).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

// ---- in place: never recorded; they change values a graph may have read, so use them for updates.
void fill_(const Tensor& x, float value) {
  Device d = same_device("fill", {x});
  float* X = static_cast<float*>(x.storage()->ptr);  // int32 zeros share 0.0f's bits
  int64_t n = x.numel();
  launch(d, "fill", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, fill, X, n, value); });
}

Tensor scale(const Tensor& x, float alpha) {
  Device d = same_device("scale", {x});
  expect_f32("scale", x, "x");
  Tensor y = Tensor::empty(x.shape(), d);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "scale", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, scale, X, Y, n, alpha); });
  record(y, "scale", {x}, [alpha](const Tensor& gy) { return std::vector<Tensor>{scale(gy, alpha)}; });
  return y;
}

Tensor operator*(const Tensor& x, float alpha) { return scale(x, alpha); }

void scale_(const Tensor& x, float alpha) {
  Device d = same_device("scale_", {x});
  expect_f32("scale_", x, "x");
  float* X = x.data();
  int64_t n = x.numel();
  launch(d, "scale_", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, scale, X, X, n, alpha); });
}

}  // namespace d2l
