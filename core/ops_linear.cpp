// matmul, bias_add, dense: forward and backward side by side.
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/ops_util.hpp"

namespace d2l {
using namespace detail;

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  Device d = same_device("matmul", {a, b});
  expect_f32("matmul", a, "a");
  expect_f32("matmul", b, "b");
  expect_ndim("matmul", a, 2, "a");
  expect_ndim("matmul", b, 2, "b");
  int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  int64_t Kb = tb ? b.dim(1) : b.dim(0), N = tb ? b.dim(0) : b.dim(1);
  if (K != Kb)
    fail("matmul", "inner sizes differ: " + str(a.shape()) + (ta ? "^T" : "") + " @ " + str(b.shape()) + (tb ? "^T" : ""));
  Tensor y = Tensor::empty({M, N}, d);
  const float *A = a.data(), *B = b.data();
  float* C = y.data();
  launch(d, "matmul", keep({a, b, y}),
         [=](const kernels::cpu::Ctx& c) { run_gemm(c, ta, tb, M, N, K, 1.0f, A, B, 0.0f, C); });
  // y = op(a) @ op(b): d op(a) = gy @ op(b)^T, d op(b) = op(a)^T @ gy, transposed back to storage.
  // A leaf operand's gradient (a Dense weight) may be deferred to zb-h1's W (core/autograd.hpp).
  record(y, "matmul", {a, b}, [a, b, ta, tb](const Tensor& gy) {
    auto grad_a = [a, b, gy, ta, tb] { return ta ? matmul(b, gy, tb, true) : matmul(gy, b, false, !tb); };
    auto grad_b = [a, gy, ta, tb] { return tb ? matmul(gy, a, true, ta) : matmul(a, gy, !ta, false); };
    Tensor ga = a.needs_grad() && !defer_weight_grad(a, grad_a) ? grad_a() : Tensor();
    Tensor gb = b.needs_grad() && !defer_weight_grad(b, grad_b) ? grad_b() : Tensor();
    return std::vector<Tensor>{ga, gb};
  });
  return y;
}

Tensor bias_add(const Tensor& x, const Tensor& b) {
  Device d = same_device("bias_add", {x, b});
  expect_f32("bias_add", x, "x");
  expect_f32("bias_add", b, "bias");
  if (x.ndim() < 2) fail("bias_add", "x must be (N, C, ...), got shape " + str(x.shape()));
  expect_ndim("bias_add", b, 1, "bias");
  int64_t outer = x.dim(0), C = x.dim(1), inner = x.numel() / std::max<int64_t>(1, outer * C);
  if (b.dim(0) != C) fail("bias_add", "bias " + str(b.shape()) + " does not match the C of x " + str(x.shape()));
  if (outer * C == 0) inner = 0;
  Tensor y = Tensor::empty(x.shape(), d);
  const float *X = x.data(), *Bp = b.data();
  float* Y = y.data();
  launch(d, "bias_add", keep({x, b, y}),
         [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, bias_add_forward, X, Bp, Y, outer, C, inner); });
  record(y, "bias_add", {x, b}, [outer, C, inner](const Tensor& gy) {
    Tensor gb = Tensor::empty({C}, gy.device());
    const float* G = gy.data();
    float* GB = gb.data();
    launch(gy.device(), "bias_add_backward", keep({gy, gb}),
           [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, bias_add_backward, G, GB, outer, C, inner); });
    return std::vector<Tensor>{gy, gb};
  });
  return y;
}

Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b) {
  return bias_add(matmul(x, w, false, true), b);
}

}  // namespace d2l
