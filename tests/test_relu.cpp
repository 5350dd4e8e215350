// relu on every backend: the CPU kernel (kernels/cpu/relu.cpp) against direct loops, its backward
// against central finite differences; the emulated CUDA kernels (kernels/cuda/relu.cu) bitwise against
// the CPU's, their backward against finite differences of the emulated forward; the op through autograd.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// y = max(x, 0); dx = dy * (x > 0) (y may stand for x: y > 0 exactly where x > 0).
D2L_DECLARE_KERNEL(relu_forward, const float* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(relu_backward, const float* x, const float* dy, float* dx, int64_t n);

using namespace d2l::test;

TEST_CASE("relu forward and backward") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
    Vec x = away_from_zero(n, 11), dy = lcg_data(n, 12), y(n), dx(n);
    std::vector<double> ref(n), dref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = x[i] > 0 ? x[i] : 0.0, dref[i] = x[i] > 0 ? dy[i] : 0.0;
    cpu::relu_forward(c, x.data(), y.data(), n);
    cpu::relu_backward(c, x.data(), dy.data(), dx.data(), n);
    CHECK(close(ref, y, 0.0, 0.0, "relu"));
    CHECK(close(dref, dx, 0.0, 0.0, "relu_backward"));
    // Gradient of L(x) = sum dy * relu(x), forward in double.
    auto L = [&](const Vec& xv) {
      double s = 0;
      for (int64_t i = 0; i < n; ++i) s += dy[i] * (xv[i] > 0 ? double(xv[i]) : 0.0);
      return s;
    };
    CHECK(grad_ok(numeric_grad(x, L), dx));
  });
}

TEST_CASE("the gradient check rejects a wrong relu gradient") {
  const int64_t n = 33;
  Vec x = away_from_zero(n, 11), dy = lcg_data(n, 12), dx(n);
  cpu::relu_backward(cpu::serial_ctx(), x.data(), dy.data(), dx.data(), n);
  auto L = [&](const Vec& xv) {
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += dy[i] * (xv[i] > 0 ? double(xv[i]) : 0.0);
    return s;
  };
  auto numeric = numeric_grad(x, L);
  check_grad_and_control(numeric, dx);
}

// ---- the emulated CUDA kernels: bitwise the CPU's (the same float operations in the same order),
// n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
const Activation kRelu{"relu", kemu::relu_forward, kemu::relu_backward, cpu::relu_forward, cpu::relu_backward, false};
void check_emulated(kemu::Stream s) {
  check_activation_emulated(s, kRelu, [](int64_t n) { return lcg_data(n, 2); });
}
}  // namespace

D2L_EMULATED_CASES("emulated relu is bitwise the CPU's; n = 0 launches nothing",
                   "emulated relu on 2 device threads", check_emulated)

TEST_CASE("emulated relu_backward matches finite differences") {
  auto x = lcg_data(300, 20);
  for (float& v : x) v = v < 0 ? v - 0.05f : v + 0.05f;  // |x| >= 0.05: no step of h crosses the kink
  CHECK(activation_fd_ok(kRelu, x, lcg_data(300, 21)));  // FD tolerances: FdTol's (emu_check.hpp)
}

// ---- the op through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("relu's backward matches finite differences; a broken one fails") {
  CHECK(op_case_ok({"relu", {{{7}, grad_input(7, 7)}}, [](auto& x) { return project(d2l::relu(x[0])); }}, d2l::cpu(0)));
}
