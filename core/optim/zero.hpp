// ZeRO (Rajbhandari et al., SC20, section 5) across the devices of one process: the Trainer's
// {.zero_stage = 1}, {.zero_stage = 2} and {.zero_stage = 3}.
//
// Data parallelism keeps a whole copy of the optimizer state on every device: with N devices the
// same momentum (SGD) or m and v (Adam) are stored N times. ZeRO lays the trainable parameters end
// to end, in the Trainer's order, as one flat vector of P elements, cuts it into N contiguous shards
// and gives shard i to device i: only device i keeps the state of those elements and only it
// updates them. Shard i is kept as pieces, one per parameter it holds elements of; a piece that is a
// whole parameter has that parameter's shape, so the step reads and writes the replica in place.
//
//   stage 1 (P_os)      after backward, a reduce-scatter: device i adds up, in device order, the
//                       .grad slices of its shard from every device (the order the 'device' kvstore
//                       adds in, so the sums have the replicated run's bits); it updates its shard in
//                       place with its state, and an all-gather copies the new values into every
//                       other replica. (N-1)/N of P goes out of each device twice: 2 Psi, as an
//                       allreduce moves. The .grad buffers stay, whole, until the next backward.
//   stage 2 (P_os+g)    the same reduce-scatter, run during backward: the moment autograd completes a
//                       replica's gradient (its gradient-ready hook, as DDP's buckets use it), each
//                       shard's slice of it is added into that shard's summed gradient, and the
//                       .grad buffer is released (a device's own whole piece takes the buffer over
//                       as its sum, with no copy). Device i ends backward holding the summed gradient
//                       of its shard alone; the update and the all-gather are stage 1's.
//   stage 3 (P_os+g+p)  PyTorch's FullyShardedDataParallel (core/optim/fsdp.hpp): the parameters are
//                       shards too, and a replica is whole only while its layer runs
//                       (gather_parameter, release_parameter); gradients go to the shards as at stage
//                       2; the step updates each shard in place and gathers nothing: the next forward
//                       does. A device's own piece that is a whole parameter is gathered by pointing
//                       the replica at it: no copy, so at N = 1 sharding costs nothing.
//
// Shards are element ranges of the flat vector, split by the one rule of every collective
// (chunk_begin, core/comm.hpp): shard i is [floor(P i / N), floor(P (i+1) / N)), so shards differ by
// at most one element, the same split as over the ranks. A parameter may straddle two
// shards (its elements are updated on two devices, through a copy of each part); a shard may be
// empty when P < N.
//
// Every buffer is tagged for the allocator (core/allocator.hpp): the state optimizer_state, the
// shards' sums summed_gradients, stage 3's shards parameters and its gathered replicas gathered,
// so what a device holds is measured, not recomputed.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
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

// The state of ZeRO stages 1, 2 and 3 over the devices of one process: per device its shard's pieces,
// each with `slots` state tensors (slot 0 SGD's momentum; Adam's m, then v), at stages 2 and 3 the
// piece's summed gradient, at stage 3 its parameter values.
class ShardedState : public Shards, NoCopy {
 public:
  ShardedState(size_t slots, int stage);
  ~ShardedState() override;

  // Whether the state is laid out for these replicas (weights[k][i]: parameter k on device i):
  // the same devices in the same order and the same parameter sizes.
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;

  // Lays the state out for these replicas. host[k][j] is parameter k's slot j unsharded (values
  // loaded by load_state_dict); where it is empty the state kept so far is used (the parameters
  // moved, reset_ctx), or zeros before the first step. Every host[k][j] is emptied.
  // A parameter on other devices than the first is a ConfigError.
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);

  // The Trainer's step (core/optim/shards.hpp): the shards laid out when needed, then
  //   stage 1  the reduce-scatter of every replica's own .grad, each device's update of its shard,
  //            the all-gather;
  //   stage 2  the same, the reduce-scatter done during backward (any gradient still in a .grad
  //            buffer, as before the first step laid the shards out, is added now);
  //   stage 3  each device's update of its parameter shard in place (every replica released first);
  //            the next forward gathers.
  // clip: clip_grad_norm_ over the summed gradients of every device's pieces (clipped()); null: off.
  void step(const StepInput& in, const Step& s, GradClip* clip) override;

  // Stage 3: the parameters become shards. The first call (the state placed as place() places it)
  // copies shard i of the replicas' values into a flat tensor on device i and releases every
  // replica's memory and gradient; the replicas keep their shapes. Later calls (a state loaded)
  // place the state again and keep the parameter shards. Replicas on other devices than those
  // sharded over are a ConfigError.
  void shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) override;
  // Stage 3: replica k on device i made whole (memory from its device's allocator, each shard's part
  // copied in, from whichever device holds it), released again, and whether it is whole now; the
  // same for every parameter of unit u.
  void gather_parameter(size_t k, size_t i);
  void release_parameter(size_t k, size_t i);
  void gather_unit(size_t u, size_t i) override;
  void release_unit(size_t u, size_t i) override;
  bool gathered(size_t k, size_t i) const override;
  const Tensor& replica(size_t k, size_t i) const override { return weights_[k][i]; }
  // Stage 3: replica k's gradient on device i, complete, added into the summed-gradient pieces of the
  // shards holding parameter k's elements (copied to their devices first), then released.
  void add_gradient(size_t k, size_t i) override;
  // Stage 3: the unsharded parameters, [k] flattened, read from the shards.
  std::vector<std::vector<float>> parameters() const override;
  void set_parameters(const std::vector<std::vector<float>>& full) override;
  // Stage 3: bytes of parameters device i keeps between layers, from the tensors it keeps.
  int64_t parameter_bytes(size_t i) const;

  // FSDP's HYBRID_SHARD (the Trainer's ShardOver::devices), stages 1 to 3: the shards are this process's
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
  const ShardLayout& layout() const { return layout_; }
  std::vector<Device> devices() const override { return devices_; }
  // The state in the unsharded layout, read from every shard: [k][j] is parameter k's slot j (its
  // shape flattened), what a replicated run would hold. Empty before place().
  std::vector<std::vector<std::vector<float>>> gather_state() const override;
  // Per device, its shard's state, summed gradient (stages 2, 3) and parameters (stage 3).
  void add_memory(const std::function<DeviceMemory&(Device)>& at) const override;
  // Bytes of state device i holds, from the tensors it keeps.
  int64_t bytes(size_t i) const;
  int stage() const override { return stage_; }
  // Stages 2 and 3: the summed gradient of shard i (its pieces laid end to end), kept after the step
  // until the next gradient arrives, and the bytes of the tensors that hold it (0 at stage 1).
  std::vector<float> gradient_shard(size_t i) const;
  int64_t gradient_bytes(size_t i) const;

 private:
  // Parameter k's elements [a, b) of the flat vector, kept by one device.
  struct Piece {
    size_t k;
    int64_t a, b;
    bool whole;                // the whole parameter: its tensors have the parameter's shape
    std::vector<Tensor> state;  // `slots` tensors
    Tensor grad;                // stages 2, 3: the summed gradient (undefined until the step's first part arrives)
    Tensor param;               // stage 3: the values
  };
  size_t slots_;
  int stage_;
  std::optional<dist::Group> replicas_;  // hybrid sharding: the ranks the shards are replicated over
  ShardLayout layout_;
  std::vector<Device> devices_;
  std::vector<Shape> shapes_;                 // per parameter
  std::vector<std::vector<Piece>> pieces_;    // per device: the pieces of its shard, in flat order
  std::vector<std::vector<Tensor>> weights_;  // [k][i]: the replicas (stage 3: whole only while gathered)
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> replica_;  // leaf -> (parameter, device)
  std::vector<std::vector<size_t>> units_;    // stage 3: per unit, its parameters
  bool stale_ = false;     // the sums are the last step's: dropped when the next gradient arrives
  bool received_ = false;  // a gradient was added in since the last step
  int hook_ = -1;          // stage 2's gradient-ready hook
  Shape piece_shape(const Piece& p) const;
  // Stage 1's reduce-scatter of grads[k][i], replica i's own gradient of parameter k (summed: the
  // grads hold the sum already), then update_and_gather; stage 2's, from the sums made in backward.
  void reduce_scatter_step(const std::vector<std::vector<Tensor>>& weights,
                           const std::vector<std::vector<Tensor>>& grads, const Step& s, bool summed, GradClip* clip);
  void scattered_step(const std::vector<std::vector<Tensor>>& weights, const Step& s, GradClip* clip);
  // Stage 3's update of every device's parameter shard.
  void step_shards(const Step& s, GradClip* clip);
  void scatter_if_mine(TensorImpl& leaf);
  void scatter_remaining();
  void sum_over_replicas(const std::vector<std::vector<Tensor>>& g) const;
  // Stages 2 and 3: every device's summed-gradient pieces for the step (zeros where no gradient
  // arrived), kept until the next gradient arrives.
  std::vector<std::vector<Tensor>> take_sums();
  // Each device updates its pieces: w the replica on the piece's device (a copy of the part, for a
  // piece that is part of a parameter), g its summed gradient; then all_gather().
  void update_and_gather(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& g,
                         const Step& s);
  // The parts updated through a copy go back into their replica; then each piece's new values are
  // copied from its device into every other replica.
  void all_gather() override;
  struct Part {
    size_t i;
    const Piece* p;
    Tensor w;  // its updated values
  };
  std::vector<Part> parts_;                                  // this step's copies of parts
  const std::vector<std::vector<Tensor>>* gathering_ = nullptr;  // this step's replicas
};

}  // namespace d2l::optim::zero
