// Gluon's contrib SyncBatchNorm (PyTorch's nn.SyncBatchNorm): BatchNorm whose training statistics
// are those of the whole data-parallel batch, over every device's shard, instead of each device's
// own. Same parameters, names and defaults as BatchNorm (weight, bias, running_mean, running_var;
// momentum 0.1, eps 1e-5), so checkpoints move between the two.
//
// forward_shards(xs) (xs[i] on device i; Sequential and Residual pass the shards layer by layer):
//   training    per-channel mean and biased variance over all shards together, each shard
//               normalised on its own device with them; every replica's running statistics updated
//               identically (unbiased variance); the backward of each shard reaches every shard's
//               input through the shared statistics (core/ops.hpp). Shards with N = 0 are
//               allowed as long as the shards hold more than one value per channel in total.
//   evaluation  each device's running statistics, no communication (as BatchNorm).
// forward(x) is the group of one shard: BatchNorm on x.
//
//   auto bn = std::make_shared<SyncBatchNorm>();  // nn.SyncBatchNorm()
#pragma once
#include <string>
#include <vector>

#include "core/nn/batch_norm.hpp"

namespace d2l::nn {

class SyncBatchNorm : public BatchNorm {
 public:
  explicit SyncBatchNorm(int64_t in_channels = 0, float momentum = 0.1f, float eps = 1e-5f)
      : BatchNorm(in_channels, momentum, eps) {}

  Tensor forward(const Tensor& x) override { return forward_shards({x}).at(0); }
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override;
  std::string type() const override { return "SyncBatchNorm"; }
};

}  // namespace d2l::nn
