// Gluon's nn.Activation: an elementwise nonlinearity as a block, and the one table of activation
// names that Activation, Dense(activation=...) and Conv2D(activation=...) all read: "relu" and
// "sigmoid" (core/nn/activation.cpp; a new op is one more row there). Any other name is a
// ConfigError naming the block and the names it accepts.
//
//   auto act = std::make_shared<Activation>("relu");  // nn.Activation('relu')
#pragma once
#include <string>

#include "core/nn/block.hpp"

namespace d2l::nn {

using ActivationOp = Tensor (*)(const Tensor&);

// The op named `name` in the table; "" (no activation, Gluon's activation=None) is nullptr. Unknown
// names throw ConfigError "<block>: unknown activation 'tanh' (supported: relu, sigmoid)".
ActivationOp activation_op(const std::string& block, const std::string& name);
std::string activation_names();  // "relu, sigmoid": the table's names, for messages and --help

class Activation : public Block {
 public:
  explicit Activation(const std::string& act_type);

  Tensor forward(const Tensor& x) override;  // any shape -> same shape
  std::string type() const override { return "Activation"; }
  std::string describe() const override { return "Activation(" + act_type_ + ")"; }

 private:
  std::string act_type_;
  ActivationOp op_;
};

}  // namespace d2l::nn
