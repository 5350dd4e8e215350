#include "core/nn/sync_batch_norm.hpp"

#include "core/ops.hpp"

namespace d2l::nn {

std::vector<Tensor> SyncBatchNorm::forward_shards(const std::vector<Tensor>& xs) {
  std::vector<Tensor> gamma, beta, rmean, rvar;
  for (const Tensor& x : xs) {
    infer_channels(x);  // (N, C) or (N, C, H, W); completes the deferred (C) shapes
    const Device d = x.device();
    gamma.push_back(weight->data(d));
    beta.push_back(bias->data(d));
    rmean.push_back(running_mean->data(d));
    rvar.push_back(running_var->data(d));
  }
  return sync_batch_norm(xs, gamma, beta, rmean, rvar, momentum, eps);
}

}  // namespace d2l::nn
