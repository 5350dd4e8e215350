// add, axpy and mul on every backend: the CPU kernels (kernels/cpu/add.cpp) against direct double
// loops, at odd sizes, with 1 and 2 device threads; the emulated CUDA kernels (kernels/cuda/add.cu)
// bitwise against the CPU's; add and mul through autograd.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// y = a + b and y = a * b elementwise (y may be a). axpy (y += alpha * x) is shared (kernels/cpu/kernels.hpp).
D2L_DECLARE_KERNEL(add, const float* a, const float* b, float* y, int64_t n);
D2L_DECLARE_KERNEL(mul, const float* a, const float* b, float* y, int64_t n);

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

// ---- the emulated CUDA kernels: bitwise the CPU's (the same float operations in the same order; g++
// does not contract a*b+c into an fma), n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
void check_emulated(kemu::Stream s) {
  for_grid_sizes([&](int64_t n) {
    const auto a = lcg_data(n, 2), b = lcg_data(n, 3);
    Vec got(n), ref(n);
    kemu::add(s, a.data(), b.data(), got.data(), n);
    cpu::add(cpu::serial_ctx(), a.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "add"));
    kemu::add(s, got.data(), b.data(), got.data(), n);  // in place: y is a
    cpu::add(cpu::serial_ctx(), ref.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "add in place"));
    kemu::axpy(s, -1.5f, a.data(), got.data(), n);
    cpu::axpy(cpu::serial_ctx(), -1.5f, a.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "axpy"));
    kemu::mul(s, a.data(), b.data(), got.data(), n);
    cpu::mul(cpu::serial_ctx(), a.data(), b.data(), ref.data(), n);
    CHECK(same_bits(ref, got, "mul"));
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated add, axpy, mul are bitwise the CPU's",
                   "emulated add, axpy, mul on 2 device threads", check_emulated)

// ---- the ops through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("add's and mul's backward match finite differences; broken ones fail") {
  CHECK(op_case_ok({"add", {{{2, 3}, grad_input(6, 8)}, {{2, 3}, grad_input(6, 9)}},
                    [](auto& x) { return project(d2l::add(x[0], x[1])); }},
                   d2l::cpu(0)));
  CHECK(op_case_ok({"mul", {{{5}, grad_input(5, 10)}, {{5}, grad_input(5, 11)}},
                    [](auto& x) { return d2l::sum(d2l::mul(x[0], x[1])); }},
                   d2l::cpu(0)));
}
