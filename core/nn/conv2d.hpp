// Gluon's nn.Conv2D on NCHW inputs: y = activation(conv2d(x, weight) + bias), weight
// (channels, in_channels, kh, kw), bias (channels). in_channels = 0 is inferred from the first
// input (deferred initialisation). kernel_size, strides and padding take an int or {h, w}.
//
//   auto c1 = std::make_shared<Conv2D>(64, 3, 1, 1);  // nn.Conv2D(64, kernel_size=3, strides=1, padding=1)
//   // Gluon's keyword form: nn.Conv2D(channels=20, kernel_size=3, activation='relu')
//   auto c2 = std::make_shared<Conv2D>(Conv2D::Options{.channels = 20, .kernel_size = 3, .activation = "relu"});
#pragma once
#include <string>

#include "core/nn/activation.hpp"
#include "core/nn/block.hpp"
#include "core/nn/layer_util.hpp"

namespace d2l::nn {

class Conv2D : public Block {
 public:
  struct Options {  // the constructor's arguments by name (designated initializers keep this order)
    int64_t channels = 0;
    Size2 kernel_size = 0;  // required, as in Gluon
    Size2 strides = 1;
    Size2 padding = 0;
    bool use_bias = true;
    int64_t in_channels = 0;
    std::string activation = "";  // "" (linear) or a name of core/nn/activation.hpp ("relu", "sigmoid")
  };
  Conv2D(int64_t channels, Size2 kernel_size, Size2 strides = 1, Size2 padding = 0, bool use_bias = true,
         int64_t in_channels = 0, const std::string& activation = "");
  explicit Conv2D(const Options& o)
      : Conv2D(o.channels, o.kernel_size, o.strides, o.padding, o.use_bias, o.in_channels, o.activation) {}

  Tensor forward(const Tensor& x) override;  // x (N, in_channels, H, W) -> (N, channels, OH, OW)
  std::string type() const override { return "Conv2D"; }
  // "Conv2D(1 -> 64, kernel_size=(3, 3), stride=(1, 1), padding=(1, 1))", Gluon's print.
  std::string describe() const override;

  ParameterPtr weight;  // (channels, in_channels, kh, kw)
  ParameterPtr bias;    // (channels), null when use_bias is false

 private:
  int64_t channels_;
  Pair kernel_, strides_, padding_;
  std::string activation_;
  ActivationOp act_;  // null: linear
};

}  // namespace d2l::nn
