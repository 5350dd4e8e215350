// relu, add, mul, scale; the in-place updates; fill and the seeded random fills.
#include "core/ops.hpp"
#include "core/ops_util.hpp"
#include "core/rng.hpp"

namespace d2l {
using namespace detail;

static void same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) fail(op, "shapes differ: " + str(a.shape()) + " and " + str(b.shape()));
}

Tensor relu(const Tensor& x) {
  Device d = same_device("relu", {x});
  expect_f32("relu", x, "x");
  Tensor y = Tensor::empty(x.shape(), d);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "relu", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, relu_forward, X, Y, n); });
  // The backward needs only where y > 0 (the same places as x > 0), so it keeps y's memory, not x's:
  // x, often a BatchNorm output nothing else keeps, is then freed (PyTorch's ReLU(inplace=True) saves
  // the same). Holding y's storage, not y, keeps y's graph node out of its own closure.
  record(y, "relu", {x}, [ys = y.storage(), shape = x.shape(), d, n](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, d);
    const float *Y = static_cast<const float*>(ys->ptr), *G = gy.data();
    float* GX = gx.data();
    launch(d, "relu_backward", {ys, gy.storage(), gx.storage()},
           [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, relu_backward, Y, G, GX, n); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor add(const Tensor& a, const Tensor& b) {
  Device d = same_device("add", {a, b});
  expect_f32("add", a, "a");
  expect_f32("add", b, "b");
  same_shape("add", a, b);
  Tensor y = Tensor::empty(a.shape(), d);
  const float *A = a.data(), *B = b.data();
  float* Y = y.data();
  int64_t n = a.numel();
  launch(d, "add", keep({a, b, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, add, A, B, Y, n); });
  record(y, "add", {a, b}, [](const Tensor& gy) { return std::vector<Tensor>{gy, gy}; });
  return y;
}

Tensor mul(const Tensor& a, const Tensor& b) {
  Device d = same_device("mul", {a, b});
  expect_f32("mul", a, "a");
  expect_f32("mul", b, "b");
  same_shape("mul", a, b);
  Tensor y = Tensor::empty(a.shape(), d);
  const float *A = a.data(), *B = b.data();
  float* Y = y.data();
  int64_t n = a.numel();
  launch(d, "mul", keep({a, b, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, mul, A, B, Y, n); });
  record(y, "mul", {a, b}, [a, b](const Tensor& gy) { return std::vector<Tensor>{mul(gy, b), mul(gy, a)}; });
  return y;
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

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }
Tensor operator*(const Tensor& x, float alpha) { return scale(x, alpha); }

// ---- in place: never recorded; they change values a graph may have read, so use them for updates.
void fill_(const Tensor& x, float value) {
  Device d = same_device("fill", {x});
  float* X = static_cast<float*>(x.storage()->ptr);  // int32 zeros share 0.0f's bits
  int64_t n = x.numel();
  launch(d, "fill", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, fill, X, n, value); });
}

void add_(const Tensor& y, const Tensor& x, float alpha) {
  Device d = same_device("add_", {y, x});
  expect_f32("add_", y, "y");
  same_shape("add_", y, x);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "add_", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, axpy, alpha, X, Y, n); });
}

void scale_(const Tensor& x, float alpha) {
  Device d = same_device("scale_", {x});
  expect_f32("scale_", x, "x");
  float* X = x.data();
  int64_t n = x.numel();
  launch(d, "scale_", keep({x}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, scale, X, X, n, alpha); });
}

void sgd_update_(const Tensor& w, const Tensor& g, float lr) {
  Device d = same_device("sgd_update", {w, g});
  same_shape("sgd_update", w, g);
  float* W = w.data();
  const float* G = g.data();
  int64_t n = w.numel();
  launch(d, "sgd_update", keep({w, g}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, sgd_update, W, G, n, lr); });
}

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
