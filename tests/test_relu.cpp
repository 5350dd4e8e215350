// relu (kernels/cpu/relu.cpp) against direct loops; its backward against central finite differences.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

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
  CHECK(grad_ok(numeric, dx));
  for (auto& v : dx) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric, dx));
}
