// ZeRO stage 1 (Rajbhandari et al., SC20, section 5.1: P_os, optimizer state partitioning) across
// the devices of one process, the Trainer's {.zero_stage = 1}.
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
// Shards are element ranges of the flat vector, split as split_and_load splits a batch: shard i has
// floor(P / N) elements, one more for the first P mod N shards. A parameter may straddle two
// shards (its elements are updated on two devices); a shard may be empty when P < N.
#pragma once
#include <cstdint>
#include <string>
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

// The optimizer state of ZeRO stage 1: per device, `slots` flat tensors of its shard's size on that
// device (slot 0 SGD's momentum; Adam's m, then v).
class ShardedState {
 public:
  explicit ShardedState(size_t slots) : slots_(slots) {}

  // Whether the state is laid out for these replicas (weights[k][i]: parameter k on device i):
  // the same devices in the same order and the same parameter sizes.
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;

  // Lays the state out for these replicas. host[k][j] is parameter k's slot j unsharded (values
  // loaded by load_state_dict); where it is empty the state kept so far is used (the parameters
  // moved, reset_ctx), or zeros before the first step. Every host[k][j] is emptied.
  // A parameter on other devices than the first is a ConfigError.
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);

  // Steps 2 and 3 above: grads[k][i] already hold the sum over the devices (the same bits on each).
  void step(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& grads,
            const Step& s);

  bool placed() const { return !devices_.empty(); }
  const ShardLayout& layout() const { return layout_; }
  const std::vector<Device>& devices() const { return devices_; }
  // The state in the unsharded layout, read from every shard: [k][j] is parameter k's slot j (its
  // shape flattened), what a replicated run would hold. Empty before place().
  std::vector<std::vector<std::vector<float>>> gather() const;
  // Bytes of state device i holds: slots * 4 * (its shard's size).
  int64_t bytes(size_t i) const;

 private:
  size_t slots_;
  ShardLayout layout_;
  std::vector<Device> devices_;
  std::vector<std::vector<Tensor>> state_;  // per device, per slot: a flat tensor of the shard's size
};

}  // namespace d2l::optim::zero
