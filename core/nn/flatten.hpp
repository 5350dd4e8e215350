// Gluon's nn.Flatten: (N, ...) -> (N, rest), sharing the input's storage (a reshape).
//
//   auto flat = std::make_shared<Flatten>();  // nn.Flatten()
#pragma once
#include <string>

#include "core/nn/block.hpp"

namespace d2l::nn {

class Flatten : public Block {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type() const override { return "Flatten"; }
};

}  // namespace d2l::nn
