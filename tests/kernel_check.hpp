// Shared pieces of the CPU kernel tests (tests/test_<op>.cpp beside kernels/cpu/<op>.cpp): serial and
// two-thread contexts, bitwise comparison, the gradient-check tolerance, and the double-precision
// reference losses the finite differences are taken of.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include <doctest/doctest.h>

#include "check.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

namespace d2l::test {

namespace cpu = d2l::kernels::cpu;
using Vec = std::vector<float>;
using Labels = std::vector<int32_t>;

inline constexpr int64_t kSizes[] = {1, 7, 33, 1037};

// A serial context and a two-thread one (the calling thread plus one helper).
struct Ctxs {
  cpu::ThreadPool pool{1};
  cpu::Ctx list[2] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
};

// Calls f(c, n) with each context of Ctxs and each size of kSizes (both captured for the messages).
template <class F>
void for_contexts_and_sizes(const F& f) {
  Ctxs ctxs;
  for (const auto& c : ctxs.list)
    for (int64_t n : kSizes) {
      CAPTURE(c.threads);
      CAPTURE(n);
      f(c, n);
    }
}

inline bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gradient check tolerance: |numeric - analytic| <= 1e-4 + 1e-3 * |numeric|. relu and bias_add are
// piecewise linear in the perturbed input, so their central difference is exact up to double
// rounding; for the losses the truncation error is h^2/6 * L''' (about 1e-7; exactly 0 for mse's
// quadratic). Either way a 5% error in the analytic gradient is far outside the tolerance.
inline bool grad_ok(const std::vector<double>& numeric, const Vec& analytic) {
  return close(numeric, analytic, 1e-4, 1e-3, "grad");
}

// A backward's negative control: `analytic` passes grad_ok, and scaled by 1.05 it fails (so the
// check could tell a wrong gradient). Registers both as the calling case's checks.
inline void check_grad_and_control(const std::vector<double>& numeric, Vec analytic) {
  CHECK(grad_ok(numeric, analytic));
  for (auto& v : analytic) v *= 1.05f;
  CHECK_FALSE(grad_ok(numeric, analytic));
}

// Test data in [-1, 1) kept at least 0.01 away from 0, so +-h never crosses relu's kink.
inline Vec away_from_zero(int64_t n, uint32_t seed) {
  Vec x = lcg_data(n, seed);
  for (auto& v : x)
    if (v > -0.01f && v < 0.01f) v = v < 0 ? v - 0.02f : v + 0.02f;
  return x;
}

// Labels in [0, K) from a tiny LCG of their own.
inline Labels make_labels(int64_t N, int64_t K, uint32_t seed) {
  Labels l(N);
  for (auto& v : l) seed = seed * 1664525u + 1013904223u, v = static_cast<int32_t>((seed >> 8) % K);
  return l;
}

// Reference per-sample cross-entropy in double: log(sum_k exp(x_k - m)) + m - x_label.
inline double ref_ce(const float* x, int64_t K, int32_t label) {
  double m = x[0], s = 0;
  for (int64_t k = 1; k < K; ++k) m = std::fmax(m, double(x[k]));
  for (int64_t k = 0; k < K; ++k) s += std::exp(double(x[k]) - m);
  return std::log(s) + m - x[label];
}

// L(logits) = sum_i dloss[i] * loss_i(logits), in double.
inline std::function<double(const Vec&)> ce_objective(const Labels& labels, const Vec& dloss, int64_t N, int64_t K) {
  return [&labels, &dloss, N, K](const Vec& x) {
    double s = 0;
    for (int64_t i = 0; i < N; ++i) s += dloss[i] * ref_ce(x.data() + i * K, K, labels[i]);
    return s;
  };
}

// L(p) = sum_i dl[i] * (p_i - t_i)^2 / 2, in double.
inline std::function<double(const Vec&)> mse_objective(const Vec& t, const Vec& dl) {
  return [&t, &dl](const Vec& p) {
    double s = 0;
    for (size_t i = 0; i < p.size(); ++i) s += dl[i] * 0.5 * (double(p[i]) - t[i]) * (double(p[i]) - t[i]);
    return s;
  };
}

struct NK {
  int64_t N, K;
};

}  // namespace d2l::test
