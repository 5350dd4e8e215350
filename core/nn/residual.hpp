// d2l's Residual block and resnet_block, as the book defines them (gluonbook; the ResNet-18 of d2l's "Concise Implementation for Multiple GPUs"):
//
//   Y = relu(bn1(conv1(X)))        conv1: 3x3, padding 1, strides
//   Y = bn2(conv2(Y))              conv2: 3x3, padding 1
//   if conv3: X = conv3(X)         conv3: 1x1, strides (use_1x1conv), matches Y's channels and size
//   return relu(Y + X)
//
// Children (and checkpoint names): conv1, conv2, conv3 (only with use_1x1conv), bn1, bn2.
//
//   auto blk = std::make_shared<Residual>(128, true, 2);  // Residual(128, use_1x1conv=True, strides=2)
//   auto stage = resnet_block(128, 2);                    // two Residuals, the first halving H and W
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/nn/batch_norm.hpp"
#include "core/nn/conv2d.hpp"
#include "core/nn/sequential.hpp"

namespace d2l::nn {

class Residual : public Block {
 public:
  explicit Residual(int64_t num_channels, bool use_1x1conv = false, int64_t strides = 1);

  Tensor forward(const Tensor& input) override;  // (N, C, H, W) -> (N, num_channels, ceil(H / strides), ceil(W / strides))
  // The same formula on the shards of one batch, each layer over all shards (SyncBatchNorm sees them all).
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& inputs) override;
  std::string type() const override { return "Residual"; }

  std::shared_ptr<Conv2D> conv1, conv2, conv3;  // conv3 null without use_1x1conv
  std::shared_ptr<BatchNorm> bn1, bn2;
};

// The book's resnet_block: num_residuals Residuals of num_channels; the first one halves the height
// and width (use_1x1conv, strides 2) unless first_block.
std::shared_ptr<Sequential> resnet_block(int64_t num_channels, int num_residuals, bool first_block = false);

}  // namespace d2l::nn
