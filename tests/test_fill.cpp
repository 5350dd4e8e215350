// fill, copy and scale (kernels/cpu/fill.cpp) against direct loops, at odd sizes, with 1 and 2 device threads.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

TEST_CASE("fill, copy and scale") {
  for_contexts_and_sizes([](const cpu::Ctx& c, int64_t n) {
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
  });
}
