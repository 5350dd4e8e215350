#include "core/nn/activation.hpp"

#include <utility>

#include "core/ops.hpp"

namespace d2l::nn {

namespace {
// The activation names every layer accepts, each the op of core/ops.hpp that it applies.
const std::pair<const char*, ActivationOp> kActivations[] = {
    {"relu", relu},
    {"sigmoid", sigmoid},
};

}  // namespace

std::string activation_names() {
  std::string s;
  for (auto& [name, op] : kActivations) s += (s.empty() ? "" : ", ") + std::string(name);
  return s;
}

ActivationOp activation_op(const std::string& block, const std::string& name) {
  if (name.empty()) return nullptr;
  for (auto& [known, op] : kActivations)
    if (name == known) return op;
  throw ConfigError(block + ": unknown activation '" + name + "' (supported: " + activation_names() + ")");
}

Activation::Activation(const std::string& act_type) : act_type_(act_type), op_(activation_op("Activation", act_type)) {
  if (!op_) throw ConfigError("Activation: an activation name is needed (supported: " + activation_names() + ")");
}

Tensor Activation::forward(const Tensor& x) { return op_(x); }

}  // namespace d2l::nn
