#include "core/nn/activation.hpp"

#include "core/nn/layer_util.hpp"
#include "core/ops.hpp"

namespace d2l::nn {

Activation::Activation(const std::string& act_type) : act_type_(act_type) {
  if (!parse_activation("Activation", act_type))
    throw ConfigError("Activation: an activation name is needed (supported: relu)");
}

Tensor Activation::forward(const Tensor& x) { return relu(x); }

}  // namespace d2l::nn
