#include "core/nn/layer_util.hpp"

namespace d2l::nn {

std::string str(Pair p) { return "(" + std::to_string(p[0]) + ", " + std::to_string(p[1]) + ")"; }

void infer_shape(const Block& block, Parameter& p, const Shape& wanted, const Tensor& x) {
  if (p.shape_known() && p.shape() != wanted)
    throw ShapeError(block.describe() + ": input " + str(x.shape()) + " needs " + p.name() + " " + str(wanted) +
                     ", but " + p.name() + " is " + str(p.shape()));
  p.infer_shape(wanted);
}

void expect_rank(const Block& block, const Tensor& x, const char* expected, int64_t lo, int64_t hi) {
  if (x.ndim() < lo || x.ndim() > hi)
    throw ShapeError(block.describe() + ": input must be " + expected + ", got " + str(x.shape()));
}

}  // namespace d2l::nn
