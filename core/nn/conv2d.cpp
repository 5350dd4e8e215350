#include "core/nn/conv2d.hpp"

#include "core/ops.hpp"

namespace d2l::nn {

Conv2D::Conv2D(int64_t channels, Size2 kernel_size, Size2 strides, Size2 padding, bool use_bias, int64_t in_channels,
               const std::string& activation)
    : channels_(channels),
      kernel_(kernel_size.hw),
      strides_(strides.hw),
      padding_(padding.hw),
      activation_(activation),
      act_(activation_op("Conv2D", activation)) {
  if (channels < 1) throw ConfigError("Conv2D: channels must be >= 1, got " + std::to_string(channels));
  if (in_channels < 0) throw ConfigError("Conv2D: in_channels must be >= 0 (0: inferred), got " + std::to_string(in_channels));
  if (kernel_[0] < 1 || kernel_[1] < 1 || strides_[0] < 1 || strides_[1] < 1 || padding_[0] < 0 || padding_[1] < 0)
    throw ConfigError("Conv2D: kernel_size " + str(kernel_) + " and strides " + str(strides_) +
                      " must be >= 1, padding " + str(padding_) + " >= 0");
  weight = register_parameter("weight", {channels, in_channels, kernel_[0], kernel_[1]});
  if (use_bias) bias = register_parameter("bias", {channels}, Init::Zero());
}

Tensor Conv2D::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, C, H, W)", 4, 4);
  infer_shape(*this, *weight, {channels_, x.dim(1), kernel_[0], kernel_[1]}, x);
  Device d = x.device();
  Tensor y = conv2d(x, weight->data(d), bias ? bias->data(d) : Tensor(), strides_, padding_);
  return act_ ? act_(y) : y;
}

std::string Conv2D::describe() const {
  int64_t in = weight->shape()[1];
  std::string s = "Conv2D(" + (in > 0 ? std::to_string(in) : std::string("None")) + " -> " + std::to_string(channels_) +
                  ", kernel_size=" + str(kernel_) + ", stride=" + str(strides_);
  if (padding_ != Pair{0, 0}) s += ", padding=" + str(padding_);
  if (!bias) s += ", bias=False";
  if (act_) s += ", Activation(" + activation_ + ")";
  return s + ")";
}

}  // namespace d2l::nn
