// Elementwise and reduction kernels (fill, copy, scale, relu, add, axpy, mul, bias_add, sum, sgd)
// against direct double loops, at odd sizes, with 1 and 2 device threads; backward kernels against
// central finite differences.
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

const int64_t kSizes[] = {1, 7, 33, 1037};

// A serial context and a two-thread one (the calling thread plus one helper).
struct Ctxs {
  cpu::ThreadPool pool{1};
  cpu::Ctx list[2] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
};

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Gradient check tolerance: |numeric - analytic| <= 1e-4 + 1e-3 * |numeric|. relu, bias_add are
// piecewise linear in the perturbed input, so the central difference is exact up to double rounding;
// a 5% error in the analytic gradient is far outside it.
bool grad_ok(const std::vector<double>& numeric, const Vec& analytic) {
  return close(numeric, analytic, 1e-4, 1e-3, "grad");
}

// Test data in [-1, 1) kept at least 0.01 away from 0, so +-h never crosses relu's kink.
Vec away_from_zero(int64_t n, uint32_t seed) {
  Vec x = lcg_data(n, seed);
  for (auto& v : x)
    if (v > -0.01f && v < 0.01f) v = v < 0 ? v - 0.02f : v + 0.02f;
  return x;
}

}  // namespace

TEST_CASE("fill, copy and scale") {
  Ctxs ctxs;
  for (const auto& c : ctxs.list)
    for (int64_t n : kSizes) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec x(n, -1.0f);
      cpu::fill(c, x.data(), n, 2.5f);
      CHECK(close(std::vector<double>(n, 2.5), x, 0.0, 0.0, "fill"));
      Vec src = lcg_data(n, 3), dst(n, 0.0f);
      cpu::copy(c, src.data(), dst.data(), n);
      CHECK(bitwise_equal(src, dst));
      std::vector<double> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = double(-0.3f) * src[i];
      cpu::scale(c, src.data(), dst.data(), n, -0.3f);
      CHECK(close(ref, dst, 0.0, 1.2e-7, "scale"));  // one float rounding
    }
}

TEST_CASE("relu forward and backward") {
  Ctxs ctxs;
  for (const auto& c : ctxs.list)
    for (int64_t n : kSizes) {
      CAPTURE(c.threads);
      CAPTURE(n);
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
    }
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

TEST_CASE("add, axpy and mul") {
  Ctxs ctxs;
  for (const auto& c : ctxs.list)
    for (int64_t n : kSizes) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec a = lcg_data(n, 21), b = lcg_data(n, 22), y(n);
      std::vector<double> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = double(a[i]) + b[i];
      cpu::add(c, a.data(), b.data(), y.data(), n);
      CHECK(close(ref, y, 1e-7, 1.2e-7, "add"));
      for (int64_t i = 0; i < n; ++i) ref[i] = double(a[i]) * b[i];
      cpu::mul(c, a.data(), b.data(), y.data(), n);
      CHECK(close(ref, y, 1e-7, 1.2e-7, "mul"));
      y = b;
      for (int64_t i = 0; i < n; ++i) ref[i] = b[i] + double(0.7f) * a[i];
      cpu::axpy(c, 0.7f, a.data(), y.data(), n);
      CHECK(close(ref, y, 2e-7, 2.4e-7, "axpy"));  // up to two float roundings
    }
}

TEST_CASE("bias_add forward and backward over (outer, C, inner)") {
  struct S {
    int64_t outer, C, inner;
  };
  Ctxs ctxs;
  for (S s : {S{1, 1, 1}, S{3, 7, 1}, S{2, 5, 33}, S{4, 3, 169}, S{1037, 10, 1}}) {
    const int64_t n = s.outer * s.C * s.inner;
    Vec x = lcg_data(n, 31), b = lcg_data(s.C, 32), dy = lcg_data(n, 33);
    std::vector<double> ref(n), dbref(s.C, 0.0);
    for (int64_t o = 0; o < s.outer; ++o)
      for (int64_t ch = 0; ch < s.C; ++ch)
        for (int64_t i = 0; i < s.inner; ++i) {
          const int64_t k = (o * s.C + ch) * s.inner + i;
          ref[k] = double(x[k]) + b[ch];
          dbref[ch] += dy[k];
        }
    Vec db_serial;
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(s.outer);
      CAPTURE(s.C);
      CAPTURE(s.inner);
      Vec y(n), db(s.C);
      cpu::bias_add_forward(c, x.data(), b.data(), y.data(), s.outer, s.C, s.inner);
      CHECK(close(ref, y, 1e-7, 1.2e-7, "bias_add"));
      cpu::bias_add_backward(c, dy.data(), db.data(), s.outer, s.C, s.inner);
      CHECK(close(dbref, db, 1e-6, 1e-6, "bias_add_backward"));
      // Gradient of L(b) = sum dy * (x + b[c]) with respect to b, forward in double.
      auto L = [&](const Vec& bv) {
        double t = 0;
        for (int64_t k = 0; k < n; ++k) t += dy[k] * (double(x[k]) + bv[(k / s.inner) % s.C]);
        return t;
      };
      CHECK(grad_ok(numeric_grad(b, L), db));
      if (db_serial.empty()) db_serial = db;
      CHECK(bitwise_equal(db_serial, db));  // threads 1 and 2 give the same bits
    }
  }
}

TEST_CASE("sum: double accumulation, bitwise the same for 1, 2 and 3 threads") {
  cpu::ThreadPool pool1(1), pool2(2);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool1}, cpu::Ctx{3, &pool2}};
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{33}, int64_t{1037}, int64_t{100003}}) {
    Vec x = lcg_data(n, 41);
    double ref = 0;
    for (float v : x) ref += v;
    Vec first;
    for (const auto& c : ctxs) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec out = {123.0f};
      cpu::sum(c, x.data(), out.data(), n);
      CHECK(close(&ref, out.data(), 1, 1e-6, 1.2e-7, "sum"));
      if (first.empty()) first = out;
      CHECK(bitwise_equal(first, out));
    }
  }
}

TEST_CASE("sum: order-sensitive data still gives the same bits for 1, 2 and 3 threads") {
  // Repeating (1, 2^60, -2^60): in double, 1 + 2^60 rounds to 2^60, so the result depends on where
  // partial sums start. Chunk bounds must not move with the thread count.
  cpu::ThreadPool pool1(1), pool2(2);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool1}, cpu::Ctx{3, &pool2}};
  const float big = std::ldexp(1.0f, 60), pattern[3] = {1.0f, big, -big};
  for (int64_t n : {int64_t{1037}, int64_t{100003}}) {
    Vec x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = pattern[i % 3];
    Vec first;
    for (const auto& c : ctxs) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec out(1);
      cpu::sum(c, x.data(), out.data(), n);
      if (first.empty()) first = out;
      CHECK(bitwise_equal(first, out));
    }
  }
}

TEST_CASE("sgd_update") {
  Ctxs ctxs;
  for (const auto& c : ctxs.list)
    for (int64_t n : kSizes) {
      CAPTURE(c.threads);
      CAPTURE(n);
      Vec w = lcg_data(n, 51), g = lcg_data(n, 52);
      std::vector<double> ref(n);
      for (int64_t i = 0; i < n; ++i) ref[i] = double(w[i]) - double(0.03f) * g[i];
      cpu::sgd_update(c, w.data(), g.data(), n, 0.03f);
      CHECK(close(ref, w, 1e-7, 2.4e-7, "sgd"));
    }
}
