// softmax_ce (kernels/cpu/softmax_ce.cpp) against a double-precision reference; its backward against
// central finite differences.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

TEST_CASE("softmax_ce forward and backward") {
  Ctxs ctxs;
  for (NK s : {NK{1, 1}, NK{1, 7}, NK{7, 1}, NK{33, 10}, NK{5, 129}, NK{1037, 3}}) {
    Vec x = lcg_data(s.N * s.K, 61), dloss = lcg_data(s.N, 62);
    for (auto& v : x) v *= 4.0f;  // logits in [-4, 4)
    Labels labels = make_labels(s.N, s.K, 63);
    std::vector<double> ref(s.N), dref(s.N * s.K);
    for (int64_t i = 0; i < s.N; ++i) {
      const float* xi = x.data() + i * s.K;
      ref[i] = ref_ce(xi, s.K, labels[i]);
      double m = xi[0], z = 0;
      for (int64_t k = 0; k < s.K; ++k) m = std::fmax(m, double(xi[k]));
      for (int64_t k = 0; k < s.K; ++k) z += std::exp(double(xi[k]) - m);
      for (int64_t k = 0; k < s.K; ++k)  // softmax - one-hot, scaled by dloss
        dref[i * s.K + k] = dloss[i] * (std::exp(double(xi[k]) - m) / z - (k == labels[i] ? 1.0 : 0.0));
    }
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(s.N);
      CAPTURE(s.K);
      Vec loss(s.N), dx(s.N * s.K);
      cpu::softmax_ce_forward(c, x.data(), labels.data(), loss.data(), s.N, s.K);
      CHECK(close(ref, loss, 1e-6, 1e-6, "softmax_ce"));
      cpu::softmax_ce_backward(c, x.data(), labels.data(), dloss.data(), dx.data(), s.N, s.K);
      CHECK(close(dref, dx, 1e-7, 1e-6, "softmax_ce_backward"));
      if (s.N * s.K <= 700) CHECK(grad_ok(numeric_grad(x, ce_objective(labels, dloss, s.N, s.K)), dx));
    }
  }
}

TEST_CASE("softmax_ce is stable for huge logits") {
  const int64_t N = 3, K = 4;
  Vec x = {1000.0f, 999.0f, 998.0f, 990.0f, -1000.0f, -1001.0f, -999.0f, -1005.0f, 88.0f, 89.0f, 90.0f, 91.0f};
  Labels labels = {0, 3, 2};
  Vec loss(N), dx(N * K), dloss(N, 1.0f);
  cpu::softmax_ce_forward(cpu::serial_ctx(), x.data(), labels.data(), loss.data(), N, K);
  cpu::softmax_ce_backward(cpu::serial_ctx(), x.data(), labels.data(), dloss.data(), dx.data(), N, K);
  std::vector<double> ref(N);
  for (int64_t i = 0; i < N; ++i) ref[i] = ref_ce(x.data() + i * K, K, labels[i]);
  CHECK(close(ref, loss, 1e-6, 1e-6, "softmax_ce huge"));
  for (float v : dx) CHECK(std::isfinite(v));
  for (int64_t i = 0; i < N; ++i) {  // each row of the gradient sums to 0
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += dx[i * K + k];
    CHECK(std::fabs(s) < 1e-6);
  }
}

TEST_CASE("the gradient check rejects a wrong softmax_ce gradient") {
  const auto c = cpu::serial_ctx();
  const int64_t N = 33, K = 10;
  Vec x = lcg_data(N * K, 61), dloss = lcg_data(N, 62), dx(N * K);
  Labels labels = make_labels(N, K, 63);
  cpu::softmax_ce_backward(c, x.data(), labels.data(), dloss.data(), dx.data(), N, K);
  auto numeric = numeric_grad(x, ce_objective(labels, dloss, N, K));
  CHECK(grad_ok(numeric, dx));
  for (auto& v : dx) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric, dx));
}
