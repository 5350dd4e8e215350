// matmul and dense (x @ w^T + b): the GEMM of core/ops/gemm.cpp (kernels/cpu/gemm, kernels/cuda/matmul).
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor matmul(const Tensor& a_in, const Tensor& b_in, bool ta, bool tb) {
  const Tensor a = autocast_input("matmul", a_in);
  const Tensor b = autocast_input("matmul", b_in);
  Device d = same_device("matmul", {a, b});
  if (!is_float(a.dtype()) || !is_float(b.dtype())) fail("matmul", "a and b must be float32, bfloat16 or float16");
  if (a.dtype() != b.dtype())
    fail("matmul", std::string("a is ") + dtype_name(a.dtype()) + " and b " + dtype_name(b.dtype()) +
                       ": cast one to the other's type first");
  expect_ndim("matmul", a, 2, "a");
  expect_ndim("matmul", b, 2, "b");
  int64_t M = ta ? a.dim(1) : a.dim(0), K = ta ? a.dim(0) : a.dim(1);
  int64_t Kb = tb ? b.dim(1) : b.dim(0), N = tb ? b.dim(0) : b.dim(1);
  if (K != Kb)
    fail("matmul", "inner sizes differ: " + str(a.shape()) + (ta ? "^T" : "") + " @ " + str(b.shape()) + (tb ? "^T" : ""));
  Tensor y;
  if (a.dtype() == DType::f32) {
    y = Tensor::empty({M, N}, d);
    const float *A = a.data(), *B = b.data();
    float* C = y.data();
    launch(d, "matmul", keep({a, b, y}),
           [=](const LaunchCtx& c) { run_gemm(c, ta, tb, M, N, K, 1.0f, A, B, 0.0f, C); });
  } else {
    // 16-bit operands: float32 sums, rounded once into a result of their type (as cuBLAS and
    // PyTorch's matmul on bfloat16 or float16 tensors give it).
    Tensor sums = Tensor::empty({M, N}, d);
    const uint16_t *A = a.data16(), *B = b.data16();
    float* C = sums.data();
    const auto f = a.dtype() == DType::bf16 ? kernels::cpu::Float16::bf16 : kernels::cpu::Float16::f16;
    launch(d, "matmul", keep({a, b, sums}),
           [=](const LaunchCtx& c) { run_gemm16(c, f, ta, tb, M, N, K, 1.0f, A, B, 0.0f, C); });
    y = cast(sums, a.dtype());
  }
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

Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b) {
  return bias_add(matmul(x, w, false, true), b);
}

}  // namespace d2l
