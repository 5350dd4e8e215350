// Gluon's pooling blocks on NCHW inputs (no parameters): MaxPool2D, AvgPool2D (padding counted in
// the divisor, Gluon's and PyTorch's default) and GlobalAvgPool2D ((N, C, H, W) -> (N, C, 1, 1)).
// strides = 0 means strides = pool_size, as in Gluon (strides=None).
//
//   auto pool = std::make_shared<MaxPool2D>(2, 2);  // nn.MaxPool2D(pool_size=(2,2), strides=(2,2))
//   auto gap = std::make_shared<GlobalAvgPool2D>();
#pragma once
#include <string>

#include "core/nn/block.hpp"
#include "core/nn/layer_util.hpp"

namespace d2l::nn {

// What MaxPool2D and AvgPool2D share: the window, stride and padding, their checks, the block's
// type and how it prints.
class Pool2D : public Block {
 public:
  std::string type() const override { return type_; }
  // "MaxPool2D(size=(2, 2), stride=(2, 2), padding=(0, 0))", Gluon's print.
  std::string describe() const override;

 protected:
  Pool2D(const char* type, Size2 pool_size, Size2 strides, Size2 padding);
  std::string type_;
  Pair size_, strides_, padding_;
};

class MaxPool2D : public Pool2D {
 public:
  explicit MaxPool2D(Size2 pool_size = 2, Size2 strides = 0, Size2 padding = 0);
  Tensor forward(const Tensor& x) override;
};

class AvgPool2D : public Pool2D {
 public:
  explicit AvgPool2D(Size2 pool_size = 2, Size2 strides = 0, Size2 padding = 0);
  Tensor forward(const Tensor& x) override;
};

class GlobalAvgPool2D : public Block {
 public:
  Tensor forward(const Tensor& x) override;
  std::string type() const override { return "GlobalAvgPool2D"; }
};

}  // namespace d2l::nn
