// sgd_update on every backend: the CPU kernel (kernels/cpu/sgd.cpp) against a direct loop, the emulated
// CUDA kernel (kernels/cuda/sgd.cu) bitwise against the CPU's.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// w -= lr * g (the book's sgd: param[:] = param - lr * grad / batch_size, lr pre-divided).
D2L_DECLARE_KERNEL(sgd_update, float* w, const float* g, int64_t n, float lr);

using namespace d2l::test;

TEST_CASE("sgd_update") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
    Vec w = lcg_data(n, 51), g = lcg_data(n, 52);
    std::vector<double> ref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = double(w[i]) - double(0.03f) * g[i];
    cpu::sgd_update(c, w.data(), g.data(), n, 0.03f);
    CHECK(close(ref, w, 1e-7, 2.4e-7, "sgd"));
  });
}

// ---- the emulated CUDA kernel: bitwise the CPU's (the same float operations in the same order),
// n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
void check_emulated(kemu::Stream s) {
  for_grid_sizes([&](int64_t n) {
    const auto a = lcg_data(n, 2), b = lcg_data(n, 3);
    Vec got = a, ref = a;
    kemu::sgd_update(s, got.data(), b.data(), n, 0.03f);
    cpu::sgd_update(cpu::serial_ctx(), ref.data(), b.data(), n, 0.03f);
    CHECK(same_bits(ref, got, "sgd_update"));
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated sgd_update is bitwise the CPU's",
                   "emulated sgd_update on 2 device threads", check_emulated)
