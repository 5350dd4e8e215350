// mse (kernels/cpu/mse.cpp) against a direct double loop; its backward against central finite differences.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

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
  CHECK(grad_ok(numeric_mse, dp));
  for (auto& v : dp) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric_mse, dp));
}
