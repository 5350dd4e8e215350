#include "core/nn/batch_norm.hpp"

#include <cstdio>

#include "core/autograd.hpp"
#include "core/nn/layer_util.hpp"
#include "core/ops.hpp"

namespace d2l::nn {

BatchNorm::BatchNorm(int64_t in_channels, float momentum, float eps) : momentum(momentum), eps(eps) {
  if (in_channels < 0) throw ConfigError("BatchNorm: in_channels must be >= 0 (0: inferred), got " + std::to_string(in_channels));
  if (!(momentum >= 0.0f && momentum <= 1.0f)) throw ConfigError("BatchNorm: momentum must be in [0, 1], got " + std::to_string(momentum));
  if (!(eps > 0.0f)) throw ConfigError("BatchNorm: eps must be > 0, got " + std::to_string(eps));
  weight = register_parameter("weight", {in_channels}, Init::One());
  bias = register_parameter("bias", {in_channels}, Init::Zero());
  running_mean = register_parameter("running_mean", {in_channels}, Init::Zero(), false);
  running_var = register_parameter("running_var", {in_channels}, Init::One(), false);
}

int64_t BatchNorm::infer_channels(const Tensor& x) {
  if (x.ndim() != 2 && x.ndim() != 4)
    throw ShapeError(describe() + ": input must be (N, C) or (N, C, H, W), got " + str(x.shape()));
  int64_t C = x.dim(1);
  for (auto* p : {&weight, &bias, &running_mean, &running_var}) infer_shape(*this, **p, {C}, x);
  return C;
}

Tensor BatchNorm::forward(const Tensor& x) {
  infer_channels(x);
  Device d = x.device();
  return batch_norm(x, weight->data(d), bias->data(d), running_mean->data(d), running_var->data(d),
                    is_recomputing() ? 0.0f : momentum, eps);  // a recomputed forward: statistics once
}

std::string BatchNorm::describe() const {
  char num[64];
  std::snprintf(num, sizeof num, "eps=%g, momentum=%g", static_cast<double>(eps), static_cast<double>(momentum));
  int64_t C = weight->shape()[0];
  return type() + "(axis=1, " + num + ", in_channels=" + (C > 0 ? std::to_string(C) : std::string("None")) + ")";
}

}  // namespace d2l::nn
