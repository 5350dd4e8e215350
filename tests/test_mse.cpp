// mse on every backend: the CPU kernel (kernels/cpu/mse.cpp) against a direct double loop, its backward
// against central finite differences; the emulated CUDA kernels (kernels/cuda/mse.cu) bitwise against
// the CPU's, their backward against finite differences of the emulated forward; the op through autograd.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// Per element, d2l's squared_loss: l = (p - t)^2 / 2; dp = dl * (p - t).
D2L_DECLARE_KERNEL(mse_forward, const float* p, const float* t, float* l, int64_t n);
D2L_DECLARE_KERNEL(mse_backward, const float* p, const float* t, const float* dl, float* dp, int64_t n);

using namespace d2l::test;

TEST_CASE("mse forward and backward") {
  Ctxs ctxs;
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{33}, int64_t{1037}}) {
    Vec p = lcg_data(n, 71), t = lcg_data(n, 72), dl = lcg_data(n, 73);
    std::vector<double> ref(n), dref(n);
    for (int64_t i = 0; i < n; ++i) {
      const double d = double(p[i]) - t[i];
      ref[i] = 0.5 * d * d;
      dref[i] = dl[i] * d;
    }
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec l(n), dp(n);
      cpu::mse_forward(c, p.data(), t.data(), l.data(), n);
      CHECK(close(ref, l, 1e-12, 3.6e-7, "mse"));  // three float roundings
      cpu::mse_backward(c, p.data(), t.data(), dl.data(), dp.data(), n);
      CHECK(close(dref, dp, 1e-12, 2.4e-7, "mse_backward"));
      CHECK(grad_ok(numeric_grad(p, mse_objective(t, dl)), dp));
    }
  }
}

TEST_CASE("the gradient check rejects a wrong mse gradient") {
  const auto c = cpu::serial_ctx();
  const int64_t n = 33;
  Vec p = lcg_data(n, 71), t = lcg_data(n, 72), dl = lcg_data(n, 73), dp(n);
  cpu::mse_backward(c, p.data(), t.data(), dl.data(), dp.data(), n);
  auto numeric_mse = numeric_grad(p, mse_objective(t, dl));
  check_grad_and_control(numeric_mse, dp);
}

// ---- the emulated CUDA kernels: bitwise the CPU's (the same float operations in the same order),
// n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
void check_emulated(kemu::Stream s) {
  for_grid_sizes([&](int64_t n) {
    const auto a = lcg_data(n, 2), b = lcg_data(n, 3), dy = lcg_data(n, 4);
    Vec got(n), ref(n);
    kemu::mse_forward(s, a.data(), b.data(), got.data(), n);
    cpu::mse_forward(cpu::serial_ctx(), a.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "mse_forward"));
    kemu::mse_backward(s, a.data(), b.data(), dy.data(), got.data(), n);
    cpu::mse_backward(cpu::serial_ctx(), a.data(), b.data(), dy.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "mse_backward"));
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated mse is bitwise the CPU's", "emulated mse on 2 device threads", check_emulated)

TEST_CASE("emulated mse_backward matches finite differences") {
  const auto p = lcg_data(257, 22), t = lcg_data(257, 23), r = lcg_data(257, 24);
  Vec dp(257);
  kemu::mse_backward(nullptr, p.data(), t.data(), r.data(), dp.data(), 257);
  auto loss = [&](const std::vector<double>& pd) {
    const auto pf = to_float(pd);
    Vec l(pf.size());
    kemu::mse_forward(nullptr, pf.data(), t.data(), l.data(), 257);
    return dot(to_double(l), r);
  };
  CHECK(grad_check(p, dp, loss, {1e-2}, "mse dp"));  // FD tolerances: FdTol's (emu_check.hpp)
}

// ---- the op through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("mse_loss's backward matches finite differences; a broken one fails") {
  CHECK(op_case_ok({"mse_loss", {{{6}, grad_input(6, 15)}, {{6}, grad_input(6, 16)}},
                    [](auto& x) { return d2l::mse_loss(x[0], x[1], d2l::Reduction::mean); }},
                   d2l::cpu(0)));
}
