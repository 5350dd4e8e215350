// argmax and count_correct on every backend: the CPU kernels (kernels/cpu/argmax.cpp) against direct
// loops; the emulated CUDA kernels (kernels/cuda/argmax.cu) equal to the CPU's (exact by nature).
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// x (N, K) -> idx (N) int32, the first index of each row's maximum; correct[0] = #{i : idx[i] == labels[i]}.
D2L_DECLARE_KERNEL(argmax, const float* x, int32_t* idx, int64_t N, int64_t K);
D2L_DECLARE_KERNEL(count_correct, const float* x, const int32_t* labels, float* correct, int64_t N, int64_t K);

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

// ---- the emulated CUDA kernels equal the CPU's, on (N, K) with classes fewer than, equal to and more
// than a warp's 32 lanes.
namespace {
void check_emulated(kemu::Stream s) {
  for_row_shapes([&](const RowsShape& r) {
    auto x = lcg_data(r.N * r.K, 12);
    for (float& v : x) v = std::round(v * 3.0f);  // few distinct values: many ties (the first one wins)
    std::vector<int32_t> idx(r.N, -7), idx_ref(r.N, -7);
    kemu::argmax(s, x.data(), idx.data(), r.N, r.K);
    cpu::argmax(cpu::serial_ctx(), x.data(), idx_ref.data(), r.N, r.K);
    CHECK(idx == idx_ref);
    auto labels = labels_for(r.N, r.K, 13);
    for (size_t i = 0; i < labels.size(); i += 2) labels[i] = idx_ref[i];  // about half right
    float correct = NAN, correct_ref = NAN;
    kemu::count_correct(s, x.data(), labels.data(), &correct, r.N, r.K);
    cpu::count_correct(cpu::serial_ctx(), x.data(), labels.data(), &correct_ref, r.N, r.K);
    CHECK(correct == correct_ref);
  });
  float none = NAN;
  kemu::count_correct(s, nullptr, nullptr, &none, 0, 10);
  CHECK(none == 0.0f);
}
}  // namespace

D2L_EMULATED_CASES("emulated argmax and count_correct equal the CPU's",
                   "emulated argmax and count_correct on 2 device threads", check_emulated)
