// Synchronised batch norm (SyncBatchNorm): batch norm over the whole of a data-parallel batch whose
// shards live on several devices, built from three differentiable ops (kernels in
// kernels/{cpu,cuda}/batch_norm_stats) and the differentiable copies between devices:
//
//   x_j (device j) -> batch_norm_stats -> s_j (2, C) --to(d0)--+
//                                                              concat -> batch_norm_combine_stats -> g (2, C) on d0
//   x_j, g.to(device j), gamma_j, beta_j -> batch_norm_apply -> y_j
//
// d0 is the device of the first non-empty shard. The graph joins every shard: a backward from one
// device's loss reaches every shard's x through the combined statistics, so the gradients summed
// over the book's per-device backward calls (for l in ls: l.backward()) are those of batch_norm on
// the whole batch. Statistics are (2, C) tensors: row 0 the mean, row 1 the biased variance.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

// One shard's statistics: x (N, C) or (N, C, H, W) with N*H*W >= 1 -> (2, C). Differentiable.
Tensor batch_norm_stats(const Tensor& x);

// K shards' statistics stacked as (2K, C) (the concat of their batch_norm_stats) and each shard's
// values per channel (N_j*H*W) -> the whole batch's (2, C). Differentiable.
Tensor batch_norm_combine_stats(const Tensor& stats, const std::vector<int64_t>& counts);

// y = gamma * (x - mean) / sqrt(var + eps) + beta with the statistics given as stats (2, C);
// gamma, beta (C). Differentiable in x, stats, gamma and beta.
Tensor batch_norm_apply(const Tensor& x, const Tensor& stats, const Tensor& gamma, const Tensor& beta,
                        float eps = 1e-5f);

// running = (1 - momentum) * running + momentum * batch statistic, the variance made unbiased with
// `count` values per channel (var * count / (count - 1)), as batch_norm does. In place, never recorded.
void batch_norm_update_running_(const Tensor& stats, int64_t count, const Tensor& running_mean,
                                const Tensor& running_var, float momentum);

// The whole: shard j is xs[j] with gamma[j], beta[j], running_mean[j], running_var[j] on its device
// (the replicas of one BatchNorm). Training mode (is_training()): every shard is normalised with the
// statistics of all shards together, and the running statistics on every device listed are updated
// with them (once per device); shards with N = 0 are allowed (an empty output) as long as the shards
// hold more than one value per channel in total. Evaluation mode: batch_norm with each device's
// running statistics, no communication.
std::vector<Tensor> sync_batch_norm(const std::vector<Tensor>& xs, const std::vector<Tensor>& gamma,
                                    const std::vector<Tensor>& beta, const std::vector<Tensor>& running_mean,
                                    const std::vector<Tensor>& running_var, float momentum = 0.1f,
                                    float eps = 1e-5f);

}  // namespace d2l
