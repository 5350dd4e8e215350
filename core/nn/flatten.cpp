#include "core/nn/flatten.hpp"

#include "core/nn/layer_util.hpp"
#include "core/ops.hpp"

namespace d2l::nn {

Tensor Flatten::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, ...)", 1);
  return flatten(x);
}

}  // namespace d2l::nn
