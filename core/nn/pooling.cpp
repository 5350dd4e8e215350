#include "core/nn/pooling.hpp"

namespace d2l::nn {

Pool2D::Pool2D(const char* type, Size2 pool_size, Size2 strides, Size2 padding)
    : type_(type), size_(pool_size.hw), strides_(strides.hw == Pair{0, 0} ? pool_size.hw : strides.hw), padding_(padding.hw) {
  if (size_[0] < 1 || size_[1] < 1 || strides_[0] < 1 || strides_[1] < 1 || padding_[0] < 0 || padding_[1] < 0)
    throw ConfigError(std::string(type) + ": pool_size " + str(size_) + " and strides " + str(strides_) +
                      " must be >= 1, padding " + str(padding_) + " >= 0");
}

std::string Pool2D::describe() const {
  return type() + "(size=" + str(size_) + ", stride=" + str(strides_) + ", padding=" + str(padding_) + ")";
}

MaxPool2D::MaxPool2D(Size2 pool_size, Size2 strides, Size2 padding) : Pool2D("MaxPool2D", pool_size, strides, padding) {}
AvgPool2D::AvgPool2D(Size2 pool_size, Size2 strides, Size2 padding) : Pool2D("AvgPool2D", pool_size, strides, padding) {}

Tensor MaxPool2D::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, C, H, W)", 4, 4);
  return max_pool2d(x, size_, strides_, padding_);
}

Tensor AvgPool2D::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, C, H, W)", 4, 4);
  return avg_pool2d(x, size_, strides_, padding_);
}

Tensor GlobalAvgPool2D::forward(const Tensor& x) {
  expect_rank(*this, x, "(N, C, H, W)", 4, 4);
  return global_avg_pool2d(x);
}

}  // namespace d2l::nn
