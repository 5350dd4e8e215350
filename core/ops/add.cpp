// add, mul and add_ (y += alpha * x): elementwise over same-shaped tensors (kernels/{cpu,cuda}/add).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor add(const Tensor& a, const Tensor& b) {
  Device d = same_device("add", {a, b});
  expect_f32("add", a, "a");
  expect_f32("add", b, "b");
  expect_same_shape("add", a, b);
  Tensor y = Tensor::empty(a.shape(), d);
  const float *A = a.data(), *B = b.data();
  float* Y = y.data();
  int64_t n = a.numel();
  launch(d, "add", keep({a, b, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, add, A, B, Y, n); });
  record(y, "add", {a, b}, [](const Tensor& gy) { return std::vector<Tensor>{gy, gy}; });
  return y;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }

Tensor mul(const Tensor& a, const Tensor& b) {
  Device d = same_device("mul", {a, b});
  expect_f32("mul", a, "a");
  expect_f32("mul", b, "b");
  expect_same_shape("mul", a, b);
  Tensor y = Tensor::empty(a.shape(), d);
  const float *A = a.data(), *B = b.data();
  float* Y = y.data();
  int64_t n = a.numel();
  launch(d, "mul", keep({a, b, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, mul, A, B, Y, n); });
  record(y, "mul", {a, b}, [a, b](const Tensor& gy) { return std::vector<Tensor>{mul(gy, b), mul(gy, a)}; });
  return y;
}

void add_(const Tensor& y, const Tensor& x, float alpha) {
  Device d = same_device("add_", {y, x});
  expect_f32("add_", y, "y");
  expect_same_shape("add_", y, x);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "add_", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, axpy, alpha, X, Y, n); });
}

}  // namespace d2l
