// add, axpy and mul (kernels/cpu/add.cpp) against direct double loops, at odd sizes, with 1 and 2 device threads.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

TEST_CASE("add, axpy and mul") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
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
  });
}
