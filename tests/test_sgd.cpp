// sgd_update (kernels/cpu/sgd.cpp) against a direct loop.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

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
