// Gluon's nn.BatchNorm over axis 1 of (N, C) or (N, C, H, W), with PyTorch's parameter names and
// momentum convention (the checkpoint layout):
//   weight (C)  gamma, ones          running_mean (C)  zeros, no gradient
//   bias   (C)  beta, zeros          running_var  (C)  ones,  no gradient
// Training mode (is_training()) normalises with the batch's statistics and updates the running
// statistics of the replica on the input's device: running = (1 - momentum) * running + momentum *
// batch (unbiased variance). Each device thus keeps statistics of its own shards (Gluon's
// behaviour). Evaluation mode uses the running statistics of the evaluating device.
// in_channels = 0 is inferred from the first input.
//
//   auto bn = std::make_shared<BatchNorm>();  // nn.BatchNorm()
//
// A block that normalises across devices (SyncBatchNorm) derives from this one and overrides
// forward_shards; the parameters, momentum and eps are members it can use.
#pragma once
#include <string>

#include "core/nn/block.hpp"

namespace d2l::nn {

class BatchNorm : public Block {
 public:
  explicit BatchNorm(int64_t in_channels = 0, float momentum = 0.1f, float eps = 1e-5f);
  ~BatchNorm() override = default;

  Tensor forward(const Tensor& x) override;  // x (N, C) or (N, C, H, W) -> same shape
  std::string type() const override { return "BatchNorm"; }
  // "BatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=64)" (None while inferred).
  std::string describe() const override;

  ParameterPtr weight, bias;               // gamma, beta (C)
  ParameterPtr running_mean, running_var;  // (C), states without a gradient
  float momentum;  // weight of the new batch statistics in the running ones (PyTorch's convention)
  float eps;       // added to the variance

 protected:
  // Checks x is (N, C) or (N, C, H, W) and completes the deferred (C) shapes from it (or checks a
  // later input has the same C). Returns C.
  int64_t infer_channels(const Tensor& x);
};

}  // namespace d2l::nn
