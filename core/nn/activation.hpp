// Gluon's nn.Activation: an elementwise nonlinearity as a block. Only "relu" is built (what the
// book's networks use); any other name is a ConfigError naming it.
//
//   auto act = std::make_shared<Activation>("relu");  // nn.Activation('relu')
#pragma once
#include <string>

#include "core/nn/block.hpp"

namespace d2l::nn {

class Activation : public Block {
 public:
  explicit Activation(const std::string& act_type);

  Tensor forward(const Tensor& x) override;  // any shape -> same shape
  std::string type() const override { return "Activation"; }
  std::string describe() const override { return "Activation(" + act_type_ + ")"; }

 private:
  std::string act_type_;
};

}  // namespace d2l::nn
