// argmax and count_correct (kernels/cpu/argmax.cpp) against direct loops.
#include <doctest/doctest.h>

#include "kernel_check.hpp"

using namespace d2l::test;

TEST_CASE("argmax picks the first maximum; count_correct counts matches") {
  Ctxs ctxs;
  for (NK s : {NK{1, 1}, NK{7, 1}, NK{1, 7}, NK{33, 10}, NK{3001, 5}}) {
    Vec x = lcg_data(s.N * s.K, 81);
    for (auto& v : x) v = std::round(v * 2.0f) / 2.0f;  // few distinct values: plenty of ties
    Labels ref(s.N);
    for (int64_t i = 0; i < s.N; ++i) {
      int32_t best = 0;
      for (int64_t k = 0; k < s.K; ++k)
        if (x[i * s.K + k] > x[i * s.K + best]) best = int32_t(k);
      ref[i] = best;
    }
    Labels labels = make_labels(s.N, s.K, 82);
    for (int64_t i = 0; i < s.N; i += 2) labels[i] = ref[i];  // at least half correct
    int64_t ref_count = 0;
    for (int64_t i = 0; i < s.N; ++i) ref_count += labels[i] == ref[i];
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(s.N);
      CAPTURE(s.K);
      Labels idx(s.N, -1);
      cpu::argmax(c, x.data(), idx.data(), s.N, s.K);
      CHECK(idx == ref);
      float correct = -1.0f;
      cpu::count_correct(c, x.data(), labels.data(), &correct, s.N, s.K);
      CHECK(correct == static_cast<float>(ref_count));
    }
  }
}
