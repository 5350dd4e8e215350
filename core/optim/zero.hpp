// ZeRO stages 1 and 2 (Rajbhandari et al., SC20, sections 5.1 and 5.2: P_os, optimizer state
// partitioning, and P_os+g, gradients partitioned too) across the devices of one process, the
// Trainer's {.zero_stage = 1} and {.zero_stage = 2}.
//
// Data parallelism keeps a whole copy of the optimizer state on every device: with N devices the
// same momentum (SGD) or m and v (Adam) are stored N times. ZeRO-1 lays the trainable parameters
// end to end, in the Trainer's order, as one flat vector of P elements, cuts it into N contiguous
// shards and gives shard i to device i: only device i keeps the state of those elements and only
// it updates them. A step is then
//   1. the gradients summed over the devices, as data parallelism does (the kvstore's pushpull);
//   2. device i copies its shard of the weights and of the summed gradient into two flat buffers
//      and runs the optimizer on them with its flat state (the same kernels, element by element);
//   3. all-gather: every device's updated shard is copied into every replica's parameters,
//      so each replica ends with the whole updated vector, the same bits on every device.
// Each element is updated once, on one device, so the replicas are equal by construction.
//
// Step 2 reads only shard i of the sum, yet step 1 gives every device all of it. ZeRO-2 sums only
// what is read, and during backward: the moment autograd completes a replica's gradient (its
// gradient-ready hook, as DDP's buckets use it), each shard's part of it is added into that shard's
// summed-gradient pieces on the shard's device, and the replica's .grad buffer is released. Device
// i ends backward holding the summed gradient of its shard alone (the devices' contributions added
// in device order, as the `device` kvstore adds them, when backward runs device by device), and
// no whole gradient outlives the layer that made it; step 2 updates from that sum with the same
// code, and step 3 is the same all-gather. Per device
// (N-1)/N of the P elements go out for the reduce-scatter and (N-1)/N for the all-gather: 2(N-1)/N
// of P, where stage 1's allreduce and all-gather move 3(N-1)/N.
//
// ZeRO-3 (section 5.3, P_os+g+p; PyTorch's FullyShardedDataParallel) shards the parameters too: device
// i keeps only shard i of the flat parameter vector, and a replica is whole only while its layer
// runs (core/optim/fsdp.hpp gathers it just before the layer's forward and again before its
// backward, and hands its memory back after each). The gradients are not reduce-scattered after
// backward either: the moment a replica's gradient is complete, its elements are added into the
// shards that own them (shard j keeps one summed-gradient piece per parameter it holds a part of,
// added to in device order, as stage 2's reduce-scatter adds) and the replica's gradient is
// released. Between steps a device holds 4 Psi_i of parameters, 4 Psi_i of summed gradient and
// the state: 16 Psi_i with Adam, the paper's 16 Psi / N. The step updates each shard in place and
// gathers nothing: the next forward does.
//
// Shards are element ranges of the flat vector, split as split_and_load splits a batch: shard i has
// floor(P / N) elements, one more for the first P mod N shards. A parameter may straddle two
// shards (its elements are updated on two devices); a shard may be empty when P < N.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/optim/kvstore.hpp"
#include "core/tensor.hpp"

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

// The optimizer state of ZeRO stages 1 and 2: per device, `slots` flat tensors of its shard's size on
// that device (slot 0 SGD's momentum; Adam's m, then v); at stage 2 also the summed gradient of the
// shard, one more flat tensor of that size.
class ShardedState {
 public:
  ShardedState(size_t slots, int stage);
  ~ShardedState();
  ShardedState(const ShardedState&) = delete;
  ShardedState& operator=(const ShardedState&) = delete;

  // Whether the state is laid out for these replicas (weights[k][i]: parameter k on device i):
  // the same devices in the same order and the same parameter sizes.
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;

  // Lays the state out for these replicas. host[k][j] is parameter k's slot j unsharded (values
  // loaded by load_state_dict); where it is empty the state kept so far is used (the parameters
  // moved, reset_ctx), or zeros before the first step. Every host[k][j] is emptied.
  // A parameter on other devices than the first is a ConfigError.
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);

  // Stage 3: the parameters become shards. The first call (the state placed as place() places it)
  // copies shard i of the replicas' values into a flat tensor on device i and releases every
  // replica's memory and gradient; the replicas keep their shapes. Later calls (a state loaded)
  // place the state again and keep the parameter shards.
  void shard_parameters(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                        std::vector<std::vector<std::vector<float>>>& host);
  // Stage 3: replica k on device i made whole (memory from its device's allocator, each shard's part
  // copied in, from whichever device holds it), released again, and whether it is whole now.
  void gather_parameter(size_t k, size_t i);
  void release_parameter(size_t k, size_t i);
  bool gathered(size_t k, size_t i) const;
  const Tensor& replica(size_t k, size_t i) const { return weights_[k][i]; }
  // Stage 3: replica k's gradient on device i, complete, added into the summed-gradient pieces of the
  // shards holding parameter k's elements (copied to their devices first), then released.
  void scatter_gradient(size_t k, size_t i);
  // Stage 3: device i updates its parameter shard in place from its summed gradient (its pieces laid
  // end to end), then the pieces are zeroed for the next step. Every replica is released first.
  void step_shards(const Step& s);
  // Stage 3: the unsharded parameters, [k] flattened, read from the shards.
  std::vector<std::vector<float>> parameters() const;
  // Stage 3: bytes of parameters device i keeps between layers: 4 * its shard's size.
  int64_t parameter_bytes(size_t i) const;

  // Stage 1, steps 2 and 3 above: grads[k][i] already hold the sum over the devices (the same bits on each).
  void step(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& grads,
            const Step& s);
  // Stage 2: the replicas' gradients were added into the shards' pieces during backward (each the
  // moment it was complete; any still in a .grad buffer, as before the first step laid the shards
  // out, is added now), then steps 2 and 3 as at stage 1 from each shard's summed gradient.
  void scattered_step(const std::vector<std::vector<Tensor>>& weights, const Step& s);

  bool placed() const { return !devices_.empty(); }
  const ShardLayout& layout() const { return layout_; }
  const std::vector<Device>& devices() const { return devices_; }
  // The state in the unsharded layout, read from every shard: [k][j] is parameter k's slot j (its
  // shape flattened), what a replicated run would hold. Empty before place().
  std::vector<std::vector<std::vector<float>>> gather() const;
  // Bytes of state device i holds: slots * 4 * (its shard's size).
  int64_t bytes(size_t i) const;
  int stage() const { return stage_; }
  // Stages 2 and 3: the summed gradient of shard i (its pieces laid end to end), kept after the step
  // until the next gradient arrives, and its bytes: 4 * its shard's size (0 at stage 1).
  std::vector<float> gradient_shard(size_t i) const;
  int64_t gradient_bytes(size_t i) const;

 private:
  size_t slots_;
  int stage_;
  ShardLayout layout_;
  std::vector<Device> devices_;
  std::vector<std::vector<Tensor>> state_;  // per device, per slot: a flat tensor of the shard's size
  // Stages 2 and 3.
  struct Piece {
    size_t k;      // the parameter
    int64_t a, b;  // its elements [a, b) of the flat vector
    Tensor grad;   // their summed gradient, on the shard's device
  };
  std::vector<std::vector<Tensor>> weights_;  // [k][i]: the replicas, whole only while gathered
  std::vector<Tensor> param_shards_;          // per device: its shard of the flat parameter vector
  std::vector<std::vector<Piece>> pieces_;    // per device: the parameters its shard holds parts of, in order
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> replica_;  // leaf -> (parameter, device)
  bool stale_ = false;     // the pieces hold the last step's sum: zeroed before the next gradient is added
  bool received_ = false;  // a gradient was added in since the last step
  int hook_ = -1;       // stage 2's gradient-ready hook
  void scatter_if_mine(TensorImpl& leaf);
  void scatter_remaining();
  // Per device its shard's summed gradient as one flat tensor (zeros when no gradient came).
  std::vector<Tensor> summed_gradients();
  // Steps 2 and 3: device i updates shard i from its summed gradient g[i] (flat), then the all-gather.
  void update_and_gather(const std::vector<std::vector<Tensor>>& weights, const std::vector<Tensor>& g, const Step& s);
};

}  // namespace d2l::optim::zero
