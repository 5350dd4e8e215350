// ZeRO-3 (Rajbhandari et al., SC20, section 5) across the devices of one process: the Trainer's
// {.zero_stage = 3} with kvstore 'device' or 'ring', run by PyTorch's FullyShardedDataParallel
// (core/optim/fsdp.hpp). Stages 1 and 2, over one process's devices as over the ranks, are
// zero::RankShards (core/optim/zero_dist.hpp) over a group of one.
//
// Data parallelism keeps a whole copy of the parameters, gradients and optimizer state on every
// device. ZeRO-3 lays the trainable parameters end to end, in the Trainer's order, as one flat vector
// of P elements, cuts it into N contiguous shards and gives shard i to device i: only device i keeps
// those elements' values, summed gradient and state, and only it updates them. Shard i is kept as
// pieces, one per parameter it holds elements of; a piece that is a whole parameter has that
// parameter's shape.
//
//   a replica is whole only while its layer runs (gather_parameter, release_parameter): each shard's
//   part copied in from whichever device holds it (the all-gather, for one replica). A device's own
//   piece that is a whole parameter is gathered by pointing the replica at it: no copy, so at N = 1
//   sharding costs nothing.
//   the moment autograd completes a replica's gradient (FSDP's post-backward), each shard's slice of
//   it is added into that shard's summed gradient (the reduce-scatter, one contribution at a time, in
//   device order: the 'device' kvstore's bits), and the .grad buffer is released; a device's own whole
//   piece takes the buffer over as its sum.
//   the step updates each shard in place and gathers nothing: the next forward does.
//
// Shards are element ranges of the flat vector, split by the one rule of every collective
// (chunk_begin, core/comm.hpp): shard i is [floor(P i / N), floor(P (i+1) / N)), so shards differ by
// at most one element, the same split as over the ranks. A parameter may straddle two shards; a
// shard may be empty when P < N.
//
// Every buffer is tagged for the allocator (core/allocator.hpp): the state optimizer_state, the
// shards' sums summed_gradients, the shards parameters and the gathered replicas gathered, so what a
// device holds is measured, not recomputed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/dist/group.hpp"
#include "core/optim/kvstore.hpp"
#include "core/optim/shards.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::optim::zero {

// Where every element of the flat vector lives: parameter k is [offsets[k], offsets[k + 1]),
// shard i is [bounds[i], bounds[i + 1]).
struct ShardLayout {
  std::vector<int64_t> offsets;  // one per parameter, and the total P last
  std::vector<int64_t> bounds;   // one per shard, and P last
  int64_t total() const { return offsets.empty() ? 0 : offsets.back(); }
  size_t shards() const { return bounds.empty() ? 0 : bounds.size() - 1; }
  int64_t shard_size(size_t i) const { return bounds[i + 1] - bounds[i]; }
};

// The layout for parameters of these element counts over n shards (n >= 1).
ShardLayout shard_layout(const std::vector<int64_t>& sizes, size_t n);

// The state of ZeRO-3 over the devices of one process: per device its shard's pieces, each with its
// parameter values, its summed gradient and `slots` state tensors (slot 0 SGD's momentum; Adam's m,
// then v).
class ShardedState : public Shards, NoCopy {
 public:
  explicit ShardedState(size_t slots);

  // Whether the state is laid out for these replicas (weights[k][i]: parameter k on device i):
  // the same devices in the same order and the same parameter sizes.
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;

  // Lays the state out for these replicas. host[k][j] is parameter k's slot j unsharded (values
  // loaded by load_state_dict); where it is empty the state kept so far is used, or zeros before
  // the first step. Every host[k][j] is emptied. A parameter on other devices than the first is a
  // ConfigError.
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);

  // The Trainer's step (core/optim/shards.hpp): each device's update of its parameter shard in place
  // (every replica released first); the next forward gathers. clip: clip_grad_norm_ over the summed
  // gradients of every device's pieces (clipped()); null: off.
  void step(const StepInput& in, const Step& s, GradClip* clip) override;

  // The parameters become shards. The first call (the state placed as place() places it)
  // copies shard i of the replicas' values into a flat tensor on device i and releases every
  // replica's memory and gradient; the replicas keep their shapes. Later calls (a state loaded)
  // place the state again and keep the parameter shards. Replicas on other devices than those
  // sharded over are a ConfigError.
  void shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) override;
  // Replica k on device i made whole (memory from its device's allocator, each shard's part
  // copied in, from whichever device holds it), released again, and whether it is whole now; the
  // same for every parameter of unit u.
  void gather_parameter(size_t k, size_t i);
  void release_parameter(size_t k, size_t i);
  void gather_unit(size_t u, size_t i) override;
  void release_unit(size_t u, size_t i) override;
  bool gathered(size_t k, size_t i) const override;
  const Tensor& replica(size_t k, size_t i) const override { return weights_[k][i]; }
  // Replica k's gradient on device i, complete, added into the summed-gradient pieces of the
  // shards holding parameter k's elements (copied to their devices first), then released.
  void add_gradient(size_t k, size_t i) override;
  // The unsharded parameters, [k] flattened, read from the shards.
  std::vector<std::vector<float>> parameters() const override;
  void set_parameters(const std::vector<std::vector<float>>& full) override;

  // FSDP's HYBRID_SHARD (the Trainer's ShardOver::devices) at stage 3: the shards are this process's
  // devices, and every rank of `group` holds the same layout over its own devices. Each device's
  // summed pieces are then all-reduced over the group before the update (device i of every rank
  // holds shard i), so each rank updates its shards with the sum over every rank's devices, and the
  // ranks stay replicas of each other: sharded inside a machine, replicated across machines.
  void replicate_over(const dist::Group& group);

  // torch.nn.utils.clip_grad_norm_ over the shards: g[i] device i's summed-gradient pieces; the sum of
  // their squares per device, added over the devices in device order, is the unsharded sum's.
  // s as clip->apply() scales it (clip null: s).
  static Step clipped(const std::vector<std::vector<Tensor>>& g, const Step& s, GradClip* clip);

  bool placed() const override { return !devices_.empty(); }
  std::vector<Device> devices() const override { return devices_; }
  // The state in the unsharded layout, read from every shard: [k][j] is parameter k's slot j (its
  // shape flattened), what a replicated run would hold. Empty before place().
  std::vector<std::vector<std::vector<float>>> gather_state() const override;
  // Per device, its shard's state, summed gradient and parameters.
  void add_memory(const std::function<DeviceMemory&(Device)>& at) const override;
  int stage() const override { return 3; }

 private:
  // Parameter k's elements [a, b) of the flat vector, kept by one device.
  struct Piece {
    size_t k;
    int64_t a, b;
    bool whole;                // the whole parameter: its tensors have the parameter's shape
    std::vector<Tensor> state;  // `slots` tensors
    Tensor grad;                // the summed gradient (undefined until the step's first part arrives)
    Tensor param;               // the values
  };
  size_t slots_;
  std::optional<dist::Group> replicas_;  // hybrid sharding: the ranks the shards are replicated over
  ShardLayout layout_;
  std::vector<Device> devices_;
  std::vector<Shape> shapes_;                 // per parameter
  std::vector<std::vector<Piece>> pieces_;    // per device: the pieces of its shard, in flat order
  std::vector<std::vector<Tensor>> weights_;  // [k][i]: the replicas (whole only while gathered)
  std::vector<std::vector<size_t>> units_;    // per unit, its parameters
  bool stale_ = false;  // the sums are the last step's: dropped when the next gradient arrives
  Shape piece_shape(const Piece& p) const;
  // The update of every device's parameter shard.
  void step_shards(const Step& s, GradClip* clip);
  void sum_over_replicas(const std::vector<std::vector<Tensor>>& g) const;
  // Every device's summed-gradient pieces for the step (zeros where no gradient arrived), kept until
  // the next gradient arrives.
  std::vector<std::vector<Tensor>> take_sums();
  void all_gather() override {}  // the next forward gathers
  // Bytes device i keeps, from the tensors it keeps: its shard's state, summed gradient (kept after
  // the step until the next gradient arrives) and parameters.
  int64_t bytes(size_t i) const;
  int64_t gradient_bytes(size_t i) const;
  int64_t parameter_bytes(size_t i) const;
};

}  // namespace d2l::optim::zero
