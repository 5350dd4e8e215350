// sum (kernels/cpu/sum.cpp): double accumulation, bitwise the same for any thread count.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

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
