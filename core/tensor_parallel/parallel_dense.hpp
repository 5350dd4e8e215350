// The two halves of a tensor-parallel Dense (Megatron-LM, section 3). Dense weights are stored
// (out, in), PyTorch's layout; the paper writes Y = X A with A (in, out), so its "columns" of A are
// our rows of the weight and its "rows" of B our columns. Each layer runs over a group of P devices,
// one shard on each, and takes and gives one tensor per device (forward_shards; xs[i] on devices[i]).
//
//   ColumnParallelDense  the output features split in P: shard i is an ordinary Dense with out/P
//                        units on devices[i]. Input replicated, through f (so its gradient is summed
//                        over the shards); output split, [X A_1, ..., X A_P], with the activation
//                        applied per shard (exact: an elementwise function of each column).
//   RowParallelDense     the input features split in P: shard i is a Dense without bias whose weight
//                        is the in/P columns of the whole (out, in) weight, and it takes the i-th
//                        in/P features of the input (a column-parallel layer's output). The partial
//                        outputs Z_i = X_i B_i are summed by g, Y = sum_i Z_i, and the bias, replicated
//                        on every device, is added once after g (before it, it would be added P times).
//
// The shards are placed on their devices when the layer is made (their default initialisers); call
// no Block::initialize with a device list on these layers, which would copy every shard everywhere.
// Parameters: "0.weight", "0.bias", "1.weight", ... (shard i), and the row layer's "bias".
// The row layer's bias gets the whole gradient on every replica (g's backward is the identity): its
// replicas must not be summed, so these layers are trained with a per-tensor update, not a Trainer's
// kvstore, which sums replicas as data parallelism wants.
//
// Over processes: the P shards live one per rank of a dist::Group (a tensor-parallel group of the
// grid, core/dist/grid.hpp), and each rank builds only its own shard, the group rank selecting which:
// shard i of the in-process layer is the shard of group rank i, with the same name ("1.weight" on
// group rank 1). Such a layer takes and gives one tensor, on the rank's device; f and g then sum
// over the group's ranks. The shard's parameters are marked split_over_ranks (core/parameter.hpp),
// the row layer's bias is not: a Trainer's gradient norm (clip_grad_norm with a tp_group) adds the
// first over the group and counts the second once.
//
// Errors (ConfigError, one line): an empty device list, a device listed twice, P not dividing the
// dimension that is split.
#pragma once
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dist/group.hpp"
#include "core/nn/dense.hpp"

namespace d2l::tp {

class ColumnParallelDense : public nn::Block {
 public:
  ColumnParallelDense(int64_t units, const std::vector<Device>& devices, const std::string& activation = "",
                      bool use_bias = true, int64_t in_units = 0);
  // This rank's shard (group.rank() of group.size()) on `device`.
  ColumnParallelDense(int64_t units, const dist::Group& group, Device device, const std::string& activation = "",
                      bool use_bias = true, int64_t in_units = 0);

  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override;  // replicated -> split
  std::string type() const override { return "ColumnParallelDense"; }
  std::string describe() const override;  // "ColumnParallelDense(8 -> 16 over [cpu(0), cpu(1)], Activation(relu))"

  // The devices of this process's shards; over a process group, the one device of this rank.
  const std::vector<Device>& devices() const { return devices_; }
  // Shard i on devices[i]; over a process group, the one shard of this rank.
  const std::vector<std::shared_ptr<nn::Dense>>& shards() const { return shards_; }
  // The process group the shards are spread over; null when they are on the devices of this process.
  const dist::Group* group() const { return group_ ? &*group_ : nullptr; }

 private:
  int64_t units_;
  std::vector<Device> devices_;
  std::optional<dist::Group> group_;
  std::vector<std::shared_ptr<nn::Dense>> shards_;
};

class RowParallelDense : public nn::Block {
 public:
  RowParallelDense(int64_t units, int64_t in_units, const std::vector<Device>& devices, bool use_bias = true);
  // This rank's shard (group.rank() of group.size()) on `device`; the bias replicated on every rank.
  RowParallelDense(int64_t units, int64_t in_units, const dist::Group& group, Device device, bool use_bias = true);

  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override;  // split -> replicated
  std::string type() const override { return "RowParallelDense"; }
  std::string describe() const override;  // "RowParallelDense(16 -> 8 over [cpu(0), cpu(1)])"

  const std::vector<Device>& devices() const { return devices_; }
  const std::vector<std::shared_ptr<nn::Dense>>& shards() const { return shards_; }  // (units, in_units / P)
  const dist::Group* group() const { return group_ ? &*group_ : nullptr; }
  nn::ParameterPtr bias;  // (units), a replica on every device (every rank); null when use_bias is false

 private:
  int64_t units_, in_units_;
  std::vector<Device> devices_;
  std::optional<dist::Group> group_;
  std::vector<std::shared_ptr<nn::Dense>> shards_;
};

}  // namespace d2l::tp
