// add, mul and add_ (y += alpha * x): elementwise over same-shaped tensors (kernels/{cpu,cuda}/add).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/add.cpp, kernels/cuda/add.cu), over flat arrays of n: y = a + b and y = a * b
// elementwise (y may be a). add_'s axpy (y += alpha * x) is shared: core/comm.cpp's reductions call it.
D2L_DECLARE_KERNEL(add, const float* a, const float* b, float* y, int64_t n);
D2L_DECLARE_KERNEL(mul, const float* a, const float* b, float* y, int64_t n);

namespace d2l {
using namespace detail;

// a + b of one 16-bit type on a CPU device (autocast's residual additions there): kernels/cpu's add16,
// the sum rounded once; the gradient passes to both in that type.
static Tensor add_16bit(const Tensor& a, const Tensor& b) {
  same_device("add", {a, b});
  expect_same_shape("add", a, b);
  const DType t = a.dtype();
  const kernels::cpu::Float16 f = float16_of(t);
  Tensor y = Tensor::empty(a.shape(), a.device(), t);
  run("add", {a, b, y}, [=, A = a.data16(), B = b.data16(), Y = y.data16(), n = y.numel()](const LaunchCtx& c) {
    kernels::cpu::add16(c.cpu, f, A, B, Y, n);
  });
  record(y, "add", {a, b}, [t](const Tensor& gy) {
    const Tensor g = cast(gy, t);
    return std::vector<Tensor>{g, g};
  });
  return y;
}

Tensor add(const Tensor& a_in, const Tensor& b_in) {
  Tensor a = autocast_input("add", a_in);
  Tensor b = autocast_input("add", b_in);
  // Two float types: both in float32 (PyTorch promotes to the wider type).
  if (a.defined() && b.defined() && a.dtype() != b.dtype() && is_float(a.dtype()) && is_float(b.dtype()))
    a = cast(a, DType::f32), b = cast(b, DType::f32);
  if (a.defined() && in_16_bits("add", a)) return add_16bit(a, b);
  Tensor y = elementwise_output("add", {a, b});
  run("add", {a, b, y}, [A = a.data(), B = b.data(), Y = y.data(), n = y.numel()](const LaunchCtx& c) {
    D2L_KERNEL(c, add, A, B, Y, n);
  });
  record(y, "add", {a, b}, [](const Tensor& gy) { return std::vector<Tensor>{gy, gy}; });
  return y;
}

Tensor operator+(const Tensor& a, const Tensor& b) { return add(a, b); }

Tensor mul(const Tensor& a_in, const Tensor& b_in) {
  const Tensor a = autocast_input("mul", a_in);
  const Tensor b = autocast_input("mul", b_in);
  Tensor y = elementwise_output("mul", {a, b});
  run("mul", {a, b, y}, [A = a.data(), B = b.data(), Y = y.data(), n = y.numel()](const LaunchCtx& c) {
    D2L_KERNEL(c, mul, A, B, Y, n);
  });
  record(y, "mul", {a, b}, [a, b](const Tensor& gy) { return std::vector<Tensor>{mul(gy, b), mul(gy, a)}; });
  return y;
}

// In place, never recorded: it changes values a graph may have read, so use it for updates.
void add_(const Tensor& y, const Tensor& x, float alpha) {
  check_elementwise("add_", {y, x});
  run("add_", {x, y}, [=, X = x.data(), Y = y.data(), n = x.numel()](const LaunchCtx& c) { D2L_KERNEL(c, axpy, alpha, X, Y, n); });
}

}  // namespace d2l
