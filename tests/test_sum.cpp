// sum on every backend: the CPU kernel (kernels/cpu/sum.cpp), double accumulation, bitwise the same
// for any thread count; the emulated CUDA kernels (kernels/cuda/sum.cu) within 1e-6 of the CPU's (a
// double sum in another order, rounded to float once) and deterministic; the op through autograd.
#include <doctest/doctest.h>

#include <cstring>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// out[0] = sum of x (double accumulation, in a fixed order).
D2L_DECLARE_KERNEL(sum, const float* x, float* out, int64_t n);

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

// ---- the emulated CUDA kernels: within 1e-6 of the CPU's, the same bits every run.
namespace {
void check_emulated(kemu::Stream s) {
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{4099}, int64_t{1} << 18}) {
    CAPTURE(n);
    const auto x = lcg_data(n, 8);
    float got = NAN, ref = NAN, again = NAN;
    kemu::sum(s, x.data(), &got, n);
    cpu::sum(cpu::serial_ctx(), x.data(), &ref, n);
    CHECK(close(&ref, &got, 1, 1e-6, 1e-6, "sum"));
    kemu::sum(s, x.data(), &again, n);
    CHECK(std::memcmp(&got, &again, sizeof got) == 0);  // a fixed order: the same bits every run
  }
}
}  // namespace

TEST_CASE("emulated sum matches the CPU and is deterministic") { check_emulated(nullptr); }

// The blocks spread over two OS threads (a separate meson test, also under TSan): the result may not
// depend on which thread ran which block.
TEST_CASE("emulated sum on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_emulated(&two.ctx);
  const auto x = lcg_data(4099, 31);
  float one = NAN, two_threads = NAN;
  kemu::sum(nullptr, x.data(), &one, 4099);
  kemu::sum(&two.ctx, x.data(), &two_threads, 4099);
  CHECK(std::memcmp(&one, &two_threads, sizeof one) == 0);
}

// ---- the op through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("sum's backward matches finite differences; a broken one fails") {
  CHECK(op_case_ok({"sum", {{{3, 2}, grad_input(6, 13)}}, [](auto& x) { return d2l::scale(d2l::sum(x[0]), 3.0f); }},
                   d2l::cpu(0)));
}
