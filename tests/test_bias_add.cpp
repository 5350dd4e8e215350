// bias_add (kernels/cpu/bias_add.cpp) over (outer, C, inner) against direct loops; its backward against
// central finite differences.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

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
