// Loss and classification kernels (softmax_ce, mse, argmax, count_correct) against direct double
// loops with 1 and 2 device threads; backward kernels against central finite differences.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "check.hpp"
#include "core/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

namespace cpu = d2l::kernels::cpu;

namespace {

using d2l::test::close;
using d2l::test::lcg_data;
using Vec = std::vector<float>;
using d2l::test::numeric_grad;
using Labels = std::vector<int32_t>;

struct Ctxs {  // a serial context and a two-thread one (the calling thread plus one helper)
  cpu::ThreadPool pool{1};
  cpu::Ctx list[2] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
};

// Labels in [0, K) from a tiny LCG of their own.
Labels make_labels(int64_t N, int64_t K, uint32_t seed) {
  Labels l(N);
  for (auto& v : l) seed = seed * 1664525u + 1013904223u, v = static_cast<int32_t>((seed >> 8) % K);
  return l;
}

// Reference per-sample cross-entropy in double: log(sum_k exp(x_k - m)) + m - x_label.
double ref_ce(const float* x, int64_t K, int32_t label) {
  double m = x[0], s = 0;
  for (int64_t k = 1; k < K; ++k) m = std::fmax(m, double(x[k]));
  for (int64_t k = 0; k < K; ++k) s += std::exp(double(x[k]) - m);
  return std::log(s) + m - x[label];
}

// Gradient check tolerance: |numeric - analytic| <= 1e-4 + 1e-3 * |numeric|. The central difference's
// truncation error is h^2/6 * L''' (about 1e-7 here; exactly 0 for mse's quadratic), so this leaves a
// wide margin for float rounding of the analytic gradient yet rejects a 5% error.
bool grad_ok(const std::vector<double>& numeric, const Vec& analytic) {
  return close(numeric, analytic, 1e-4, 1e-3, "grad");
}

// L(logits) = sum_i dloss[i] * loss_i(logits), in double.
std::function<double(const Vec&)> ce_objective(const Labels& labels, const Vec& dloss, int64_t N, int64_t K) {
  return [&labels, &dloss, N, K](const Vec& x) {
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += dloss[i] * ref_ce(x.data() + i * K, K, labels[i]);
    return s;
  };
}

// L(p) = sum_i dl[i] * (p_i - t_i)^2 / 2, in double.
std::function<double(const Vec&)> mse_objective(const Vec& t, const Vec& dl) {
  return [&t, &dl](const Vec& p) {
    double s = 0;
    for (size_t i = 0; i < p.size(); ++i) s += dl[i] * 0.5 * (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
    return s;
  };
}

struct NK {
  int64_t N, K;
};

}  // namespace

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

TEST_CASE("the gradient check rejects wrong softmax_ce and mse gradients") {
  const auto c = cpu::serial_ctx();
  const int64_t N = 33, K = 10;
  Vec x = lcg_data(N * K, 61), dloss = lcg_data(N, 62), dx(N * K);
  Labels labels = make_labels(N, K, 63);
  cpu::softmax_ce_backward(c, x.data(), labels.data(), dloss.data(), dx.data(), N, K);
  auto numeric = numeric_grad(x, ce_objective(labels, dloss, N, K));
  CHECK(grad_ok(numeric, dx));
  for (auto& v : dx) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric, dx));

  const int64_t n = 33;
  Vec p = lcg_data(n, 71), t = lcg_data(n, 72), dl = lcg_data(n, 73), dp(n);
  cpu::mse_backward(c, p.data(), t.data(), dl.data(), dp.data(), n);
  auto numeric_mse = numeric_grad(p, mse_objective(t, dl));
  CHECK(grad_ok(numeric_mse, dp));
  for (auto& v : dp) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric_mse, dp));
}

TEST_CASE("argmax picks the first maximum; count_correct counts matches") {
  Ctxs ctxs;
  for (NK s : {NK{1, 1}, NK{7, 1}, NK{1, 7}, NK{33, 10}, NK{3001, 5}}) {
    Vec x = lcg_data(s.N * s.K, 81);
    for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;  // few distinct values: plenty of ties
    Labels ref(s.N);
    for (int64_t i = 0; i < s.N; ++i) {
      int32_t best = 0;
      for (int64_t k = 0; k < s.K; ++k)
        if (x[i * s.K + k] > x[i * s.K + best]) best = int32_t(k);
      ref[i] = best;
    }
    Labels labels = make_labels(s.N, s.K, 82);
    for (int64_t i = 0; i < s.N; i += 2) labels[i] = ref[i];  // at least half correct
    int64_t ref_count = 0;
    for (int64_t i = 0; i < s.N; ++i) ref_count += labels[i] == ref[i];
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(s.N);
      CAPTURE(s.K);
      Labels idx(s.N, -1);
      cpu::argmax(c, x.data(), idx.data(), s.N, s.K);
      CHECK(idx == ref);
      float correct = -1.0f;
      cpu::count_correct(c, x.data(), labels.data(), &correct, s.N, s.K);
      CHECK(correct == static_cast<float>(ref_count));
    }
  }
}
