#include "core/nn/residual.hpp"

#include "core/ops.hpp"

namespace d2l::nn {

Residual::Residual(int64_t num_channels, bool use_1x1conv, int64_t strides) {
  conv1 = register_child("conv1", std::make_shared<Conv2D>(num_channels, 3, strides, 1));
  conv2 = register_child("conv2", std::make_shared<Conv2D>(num_channels, 3, 1, 1));
  if (use_1x1conv) conv3 = register_child("conv3", std::make_shared<Conv2D>(num_channels, 1, strides));
  bn1 = register_child("bn1", std::make_shared<BatchNorm>());
  bn2 = register_child("bn2", std::make_shared<BatchNorm>());
}

Tensor Residual::forward(const Tensor& input) {
  Tensor X = input;
  Tensor Y = relu((*bn1)((*conv1)(X)));
  Y = (*bn2)((*conv2)(Y));
  if (conv3) X = (*conv3)(X);
  return relu(Y + X);
}

std::vector<Tensor> Residual::forward_shards(const std::vector<Tensor>& inputs) {
  std::vector<Tensor> X = inputs;
  std::vector<Tensor> Y = (*bn1)((*conv1)(X));
  for (auto& y : Y) y = relu(y);
  Y = (*bn2)((*conv2)(Y));
  if (conv3) X = (*conv3)(X);
  for (size_t i = 0; i < Y.size(); ++i) Y[i] = relu(Y[i] + X[i]);
  return Y;
}

std::shared_ptr<Sequential> resnet_block(int64_t num_channels, int num_residuals, bool first_block) {
  auto blk = std::make_shared<Sequential>();
  for (int i = 0; i < num_residuals; ++i) {
    if (i == 0 && !first_block) blk->add(std::make_shared<Residual>(num_channels, true, 2));
    else blk->add(std::make_shared<Residual>(num_channels));
  }
  return blk;
}

}  // namespace d2l::nn
