// The reference of the clipping tests (tests/test_zero.cpp, tests/test_fsdp.cpp): the 2-norm of the
// gradient the optimizer uses, (sum over the replicas of .grad) / batch, computed in double from
// every replica's .grad before the step (they are all there in the replicated run).
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

#include "core/nn/block.hpp"

namespace d2l::test {

inline double summed_gradient_norm(const nn::ParameterDict& params, int64_t batch) {
  double squares = 0;
  for (auto& p : params.trainable()) {
    std::vector<double> sum;
    for (auto& w : p->list_data()) {
      const std::vector<float> g = w.grad().to_vector();
      sum.resize(g.size(), 0.0);
      for (size_t j = 0; j < g.size(); ++j) sum[j] += g[j];
    }
    for (double v : sum) squares += v * v;
  }
  return std::sqrt(squares) / static_cast<double>(batch);
}

}  // namespace d2l::test
