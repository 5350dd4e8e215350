// What the distributed chapter tests compare: parameters as host vectors, one per tensor.
#pragma once
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/tensor.hpp"

namespace d2l::test {

// The largest over the tensors of max |a - b| / max |b|.
inline double relative_difference(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  double worst = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    double diff = 0, scale = 1e-12;
    for (size_t i = 0; i < a[t].size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::abs(a[t][i] - b[t][i])));
      scale = std::max(scale, static_cast<double>(std::abs(b[t][i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// Throws dist::CollectiveError unless every rank holds the same bits in `params`.
inline void check_same_bits_on_every_rank(const std::vector<std::vector<float>>& params) {
  std::vector<Tensor> t;
  for (auto& p : params) t.push_back(Tensor::from_vector(p, {static_cast<int64_t>(p.size())}, cpu(0)));
  dist::check_same_bits(t, "parameters");
}

// The same for a CHECK: false, with the error as the case's message, where the ranks differ (a
// collective: every rank calls it).
inline bool same_bits_on_every_rank(const std::vector<std::vector<float>>& params) {
  try {
    check_same_bits_on_every_rank(params);
    return true;
  } catch (const dist::CollectiveError& e) {
    MESSAGE(e.what());
    return false;
  }
}

}  // namespace d2l::test
