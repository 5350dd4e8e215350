// Gluon's nn.Dense: y = activation(x @ weight^T + bias), weight (units, in_units) in PyTorch's
// layout (out, in), bias (units). Inputs with more than two axes are flattened to (N, rest) first
// (Gluon's flatten=True). in_units = 0 is inferred from the first input (deferred initialisation).
//
//   auto fc = std::make_shared<Dense>(128, "relu");  // nn.Dense(128, activation='relu')
//   auto out = std::make_shared<Dense>(10);          // nn.Dense(10)
#pragma once
#include <string>

#include "core/nn/activation.hpp"
#include "core/nn/block.hpp"

namespace d2l::nn {

class Dense : public Block {
 public:
  // activation: "" (linear) or a name of the table in core/nn/activation.hpp ("relu", "sigmoid").
  explicit Dense(int64_t units, const std::string& activation = "", bool use_bias = true, int64_t in_units = 0);

  Tensor forward(const Tensor& x) override;  // x (N, in_units) or (N, ...) -> (N, units)
  std::string type() const override { return "Dense"; }
  std::string describe() const override;  // "Dense(784 -> 128, Activation(relu))", "Dense(None -> 10, linear)"
  const std::string& activation() const { return activation_; }  // "" when linear

  ParameterPtr weight;  // (units, in_units)
  ParameterPtr bias;    // (units), null when use_bias is false

 private:
  int64_t units_;
  std::string activation_;
  ActivationOp act_;  // null: linear
};

}  // namespace d2l::nn
