#include "core/nn/dense.hpp"

#include "core/nn/layer_util.hpp"
#include "core/ops.hpp"

namespace d2l::nn {

Dense::Dense(int64_t units, const std::string& activation, bool use_bias, int64_t in_units)
    : units_(units), activation_(activation), act_(activation_op("Dense", activation)) {
  if (units < 1) throw ConfigError("Dense: units must be >= 1, got " + std::to_string(units));
  if (in_units < 0) throw ConfigError("Dense: in_units must be >= 0 (0: inferred), got " + std::to_string(in_units));
  weight = register_parameter("weight", {units, in_units});
  if (use_bias) bias = register_parameter("bias", {units}, Init::Zero());
}

Tensor Dense::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, in_units) or (N, ...)", 2);
  Tensor x2 = x.ndim() > 2 ? flatten(x) : x;  // (N, in_units)
  infer_shape(*this, *weight, {units_, x2.dim(1)}, x);
  Device d = x.device();
  Tensor w = weight->data(d);
  Tensor y = bias ? dense(x2, w, bias->data(d)) : matmul(x2, w, false, true);
  return act_ ? act_(y) : y;
}

std::string Dense::describe() const {
  int64_t in = weight->shape()[1];
  return "Dense(" + (in > 0 ? std::to_string(in) : std::string("None")) + " -> " + std::to_string(units_) + ", " +
         (act_ ? "Activation(" + activation_ + ")" : "linear") + ")";
}

}  // namespace d2l::nn
