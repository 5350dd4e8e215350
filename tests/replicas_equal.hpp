// Data parallelism's invariant, for the Trainer's tests: every replica of every parameter holds the
// same bits as its first.
#pragma once
#include "core/nn/block.hpp"

namespace d2l::test {

inline bool replicas_equal(const nn::ParameterDict& params) {
  for (auto& [name, p] : params) {
    auto reps = p->list_data();
    for (size_t i = 1; i < reps.size(); ++i)
      if (reps[i].to_vector() != reps[0].to_vector()) return false;
  }
  return true;
}

}  // namespace d2l::test
