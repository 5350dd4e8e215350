// Batch-norm kernels against direct per-channel loops in double, the training backward against
// central finite differences of that reference, and the running statistics against a hand
// computation; 1, 2 and 3 threads.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"

using d2l::kernels::cpu::Ctx;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

struct Shape {
  int64_t N, C, HW;
  int64_t size() const { return N * C * HW; }
};
const std::vector<Shape> kShapes = {
    {1, 1, 7},   // batch 1, one channel
    {4, 3, 1},   // dense layer (HW = 1)
    {2, 5, 13},  // odd sizes
    {3, 2, 35},  // 7x5 feature maps
    {1, 3, 1},   // one value per channel: var 0, y = beta, dx = 0
};
constexpr float kEps = 1e-5f;

// Training-mode forward in double: per channel, biased batch statistics.
struct Ref {
  std::vector<double> y, mean, var;
};
Ref ref_train(const Shape& s, const std::vector<double>& x, const std::vector<double>& gamma,
              const std::vector<double>& beta) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(s.C, 0.0), std::vector<double>(s.C, 0.0)};
  const double M = double(s.N * s.HW);
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) r.mean[c] += x[(n * s.C + c) * s.HW + i] / M;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) {
        double d = x[(n * s.C + c) * s.HW + i] - r.mean[c];
        r.var[c] += d * d / M;
      }
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) {
        int64_t k = (n * s.C + c) * s.HW + i;
        r.y[k] = gamma[c] * (x[k] - r.mean[c]) / std::sqrt(r.var[c] + kEps) + beta[c];
      }
  }
  return r;
}

struct Out {
  std::vector<float> y, mean, invstd, running_mean, running_var;
};
Out train_forward(const Ctx& c, const Shape& s, const std::vector<float>& x, const std::vector<float>& gamma,
                  const std::vector<float>& beta, float momentum = 0.1f) {
  Out o{std::vector<float>(x.size(), -7.0f), std::vector<float>(s.C, -7.0f), std::vector<float>(s.C, -7.0f),
        std::vector<float>(s.C, 0.0f), std::vector<float>(s.C, 1.0f)};
  d2l::kernels::cpu::batch_norm_train_forward(c, s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(), kEps,
                                              momentum, o.y.data(), o.mean.data(), o.invstd.data(),
                                              o.running_mean.data(), o.running_var.data());
  return o;
}

struct Grads {
  std::vector<float> dx, dgamma, dbeta;
};
Grads backward(const Ctx& c, const Shape& s, const std::vector<float>& x, const std::vector<float>& dy,
               const std::vector<float>& gamma, const Out& o) {
  Grads g{std::vector<float>(x.size(), -7.0f), std::vector<float>(s.C, -7.0f),
          std::vector<float>(s.C, -7.0f)};
  d2l::kernels::cpu::batch_norm_backward(c, s.N, s.C, s.HW, x.data(), dy.data(), gamma.data(), o.mean.data(),
                                         o.invstd.data(), g.dx.data(), g.dgamma.data(), g.dbeta.data());
  return g;
}

std::vector<float> gamma_of(int64_t C) {  // away from zero, so dx is not trivially small
  auto g = lcg_data(C, 11);
  for (auto& v : g) v = 1.0f + 0.5f * v;
  return g;
}

}  // namespace

TEST_CASE("batch_norm training forward matches direct loops") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    auto x = lcg_data(s.size(), 1), gamma = gamma_of(s.C), beta = lcg_data(s.C, 2);
    for (auto& v : x) v = 3.0f + 2.0f * v;  // mean far from 0, var far from 1
    auto ref = ref_train(s, d2l::test::to_double(x), d2l::test::to_double(gamma), d2l::test::to_double(beta));
    std::vector<double> invstd(s.C);
    for (int64_t c = 0; c < s.C; ++c) invstd[c] = 1 / std::sqrt(ref.var[c] + kEps);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      auto o = train_forward(c, s, x, gamma, beta);
      CHECK(close(ref.y, o.y, 1e-5, 1e-5, "y"));
      CHECK(close(ref.mean, o.mean, 1e-6, 1e-6, "mean"));
      CHECK(close(invstd, o.invstd, 0, 1e-6, "invstd"));
    });
  }
}

// BN is smooth but not linear: the central-difference error is O(h^2) (h = 1e-3, ~1e-5 here), so
// atol 1e-4, rtol 1e-3.
TEST_CASE("batch_norm backward matches finite differences (dx, dgamma, dbeta)") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    auto x = lcg_data(s.size(), 3), gamma = gamma_of(s.C), beta = lcg_data(s.C, 4), r = lcg_data(s.size(), 5);
    const auto xd = d2l::test::to_double(x), gd = d2l::test::to_double(gamma),
               bd = d2l::test::to_double(beta);
    const double h = 1e-3;
    using V = std::vector<double>;
    auto fd_x = d2l::test::fd_gradient(
        x, [&](const V& v) { return d2l::test::dot(ref_train(s, v, gd, bd).y, r); }, h);
    auto fd_g = d2l::test::fd_gradient(
        gamma, [&](const V& v) { return d2l::test::dot(ref_train(s, xd, v, bd).y, r); }, h);
    auto fd_b = d2l::test::fd_gradient(
        beta, [&](const V& v) { return d2l::test::dot(ref_train(s, xd, gd, v).y, r); }, h);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      auto g = backward(c, s, x, r, gamma, train_forward(c, s, x, gamma, beta));
      CHECK(d2l::test::fd_agrees(fd_x, g.dx, 1e-4, 1e-3, "dx"));
      CHECK(d2l::test::fd_agrees(fd_g, g.dgamma, 1e-4, 1e-3, "dgamma"));
      CHECK(d2l::test::fd_agrees(fd_b, g.dbeta, 1e-4, 1e-3, "dbeta"));
    });
  }
}

TEST_CASE("batch_norm running statistics after 3 training steps, then eval forward") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    const double momentum = 0.1;
    auto gamma = gamma_of(s.C), beta = lcg_data(s.C, 6);
    std::vector<std::vector<float>> batches;
    for (uint32_t step = 0; step < 3; ++step) {
      auto x = lcg_data(s.size(), 20 + step);
      for (auto& v : x) v = float(step) + (1.0f + step) * v;  // statistics change between steps
      batches.push_back(x);
    }
    // By hand: running = (1 - momentum) * running + momentum * batch statistic, from (0, 1); the
    // variance unbiased (sum of squares / (M - 1)), or biased when M == 1.
    const int64_t M = s.N * s.HW;
    std::vector<double> rmean(s.C, 0.0), rvar(s.C, 1.0);
    for (const auto& x : batches)
      for (int64_t c = 0; c < s.C; ++c) {
        double sum = 0, sq = 0;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t i = 0; i < s.HW; ++i) sum += x[(n * s.C + c) * s.HW + i];
        const double mean = sum / M;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t i = 0; i < s.HW; ++i) sq += std::pow(x[(n * s.C + c) * s.HW + i] - mean, 2);
        rmean[c] = (1 - momentum) * rmean[c] + momentum * mean;
        rvar[c] = (1 - momentum) * rvar[c] + momentum * (M > 1 ? sq / (M - 1) : sq / M);
      }
    auto x_eval = lcg_data(s.size(), 30);
    std::vector<double> y_ref(x_eval.size());
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t i = 0; i < s.HW; ++i) {
          int64_t k = (n * s.C + c) * s.HW + i;
          y_ref[k] = gamma[c] * (x_eval[k] - rmean[c]) / std::sqrt(rvar[c] + kEps) + beta[c];
        }

    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      std::vector<float> rm(s.C, 0.0f), rv(s.C, 1.0f), y(s.size()), mean(s.C), invstd(s.C);
      for (const auto& x : batches)
        d2l::kernels::cpu::batch_norm_train_forward(c, s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(),
                                                    kEps, float(momentum), y.data(), mean.data(),
                                                    invstd.data(), rm.data(), rv.data());
      CHECK(close(rmean, rm, 1e-6, 1e-6, "running_mean"));
      CHECK(close(rvar, rv, 1e-6, 1e-6, "running_var"));
      std::vector<float> y_eval(s.size(), -7.0f);
      d2l::kernels::cpu::batch_norm_eval_forward(c, s.N, s.C, s.HW, x_eval.data(), gamma.data(), beta.data(),
                                                 rm.data(), rv.data(), kEps, y_eval.data());
      CHECK(close(y_ref, y_eval, 1e-5, 1e-5, "eval y"));
    });
  }
}

TEST_CASE("batch_norm finite-difference check rejects broken gradients") {
  const Shape s{2, 5, 13};
  auto x = lcg_data(s.size(), 3), gamma = gamma_of(s.C), beta = lcg_data(s.C, 4), r = lcg_data(s.size(), 5);
  const auto gd = d2l::test::to_double(gamma), bd = d2l::test::to_double(beta);
  auto loss = [&](const std::vector<double>& v) { return d2l::test::dot(ref_train(s, v, gd, bd).y, r); };
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto o = train_forward(c, s, x, gamma, beta);
  auto g = backward(c, s, x, r, gamma, o);
  REQUIRE(d2l::test::fd_check(x, g.dx, loss, 1e-3, 1e-4, 1e-3));

  auto scaled = g.dx;
  for (auto& v : scaled) v *= 1.05f;
  CHECK_FALSE(d2l::test::fd_check(x, scaled, loss, 1e-3, 1e-4, 1e-3, 400, {}, "dx*1.05 (expected)"));
  // The eval-mode formula dx = gamma * invstd * dy ignores that the batch statistics depend on x.
  std::vector<float> eval_mode(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t ch = 0; ch < s.C; ++ch)
      for (int64_t i = 0; i < s.HW; ++i) {
        int64_t k = (n * s.C + ch) * s.HW + i;
        eval_mode[k] = gamma[ch] * o.invstd[ch] * r[k];
      }
  CHECK_FALSE(d2l::test::fd_check(x, eval_mode, loss, 1e-3, 1e-4, 1e-3, 400, {}, "eval-mode dx (expected)"));
}
