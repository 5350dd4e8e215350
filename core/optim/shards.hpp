// The holders of ZeRO's shards, wherever they live: what the Trainer and FullyShardedDataParallel
// hold one of, and call without asking where the shards are.
//
//   zero::RankShards (core/optim/zero.hpp), stages 1 to 3: over the ranks of a group, with a piece on
//   each rank's first device or on every device; over one process's devices (a group of one), with
//   ShardOver::devices replicated over the ranks.
//
// The Trainer's step is one call, step(): the gradients summed into the shards (a reduce-scatter,
// during backward at stages 2 and 3), each holder's update of its own shard, and, at stages 1 and 2,
// the all-gather of the new values into every replica (stage 3 gathers at the next forward).
// FullyShardedDataParallel drives stage 3 through gather_unit / release_unit / add_gradient /
// unit_gradients_done, one holder index i per device of this process (one index, 0, over the ranks).
//
// The heart of every stage is written once, here: update_my_shard_then_all_gather. Each kind of
// holder hands it the pieces of the shards this process holds (their values, optimizer state and
// summed gradient: ReplicaStep) and says how its all-gather runs; the update itself is the same
// elementwise kernels as the replicated Trainer's.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/optim/kvstore.hpp"
#include "core/tensor.hpp"

namespace d2l::optim {

// What a Trainer keeps on one device (Trainer::memory_per_device), in bytes: its replicas of the
// trainable parameters, their gradients, and the optimizer state.
struct DeviceMemory {
  Device device;
  int64_t parameter_bytes = 0;
  int64_t gradient_bytes = 0;  // the parameters' .grad buffers, which autograd adds into: 4 P at every stage
  int64_t state_bytes = 0;
  // The summed gradient the step keeps on this device once the gradients are reduced: the whole sum
  // at stages 0 and 1 (4 P; the allreduce writes it into the .grad buffers above, so these are the
  // same bytes, not more), the sum of its shard only at stage 2 (4 P_i; a flat buffer of its own,
  // beside the .grad buffers, which keep this device's own contribution until they are zeroed).
  int64_t summed_gradient_bytes = 0;
};

namespace zero {

// Whether load_state_dict left a state waiting to be placed: some host[k][0] (StepInput::host) not empty.
bool loaded_state_waits(const std::vector<std::vector<std::vector<float>>>& host);
// The devices every trainable parameter is on (weights[k][i]: parameter k on device i), which one flat
// vector over them needs to be the same, in the same order, for all: else a ConfigError naming two of
// them (`where`: e.g. " in rank 1"). cpu(0) when there are no parameters.
std::vector<Device> common_devices(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                                   int stage, const std::string& where = "");
// A loaded slot of parameter k's optimizer state (host[k][j]) must be empty (nothing loaded) or hold its
// n values: else a ShapeError naming the parameter.
void check_loaded_slots(const std::vector<std::string>& names, const std::vector<std::vector<std::vector<float>>>& host,
                        size_t k, int64_t n);
// A stage-3 step on shards that FullyShardedDataParallel never placed.
ConfigError run_through_fsdp();

// What the Trainer hands its shards at each step.
struct StepInput {
  const std::vector<std::vector<Tensor>>& weights;  // [k]: parameter k's replicas, in the Trainer's order
  const std::vector<std::string>& names;
  // [k][j]: parameter k's slot j unsharded, loaded by load_state_dict and waiting to be placed
  // (emptied once placed); empty vectors when nothing waits.
  std::vector<std::vector<std::vector<float>>>& host;
  KVStore& kv;  // the Trainer's: its buckets may hold the sum already (stage 1 over the ranks)
};

class Shards {
 public:
  virtual ~Shards() = default;
  virtual int stage() const = 0;
  virtual bool placed() const = 0;

  // One optimizer step (above): lays the shards out first when needed (the first step, a loaded
  // state waiting in in.host, the parameters moved). clip: clip_grad_norm_ over every shard (null: off).
  virtual void step(const StepInput& in, const Step& s, GradClip* clip) = 0;

  // The state in the unsharded layout, [k][j]: parameter k's slot j, flattened; empty before it is
  // placed. Over ranks a collective: every rank calls it and gets all of it.
  virtual std::vector<std::vector<std::vector<float>>> gather_state() const = 0;
  // Adds what the shards hold (state; the summed gradient's shard at stages 2 and 3; the parameters'
  // shard at stage 3) to the devices holding it, at(device) being that device's row.
  virtual void add_memory(const std::function<DeviceMemory&(Device)>& at) const = 0;

  // Stage 3 (FullyShardedDataParallel). shard_parameters: the replicas' values become shards and the
  // replicas' memory is released (units[u]: the Trainer's indices of unit u's parameters); later
  // calls place a loaded state again. The holders of this process: its devices, or its one device.
  virtual void shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units);
  virtual std::vector<Device> devices() const = 0;
  virtual const Tensor& replica(size_t k, size_t i) const;
  // Unit u's replicas on holder i made whole (queued only, by prefetch_unit, where the collective
  // can run ahead), handed back, and whether parameter k's replica on holder i is whole now.
  virtual void gather_unit(size_t u, size_t i);
  virtual void prefetch_unit(size_t u, size_t i) { gather_unit(u, i); }
  virtual void release_unit(size_t u, size_t i);
  virtual bool gathered(size_t k, size_t i) const;
  // Parameter k's replica on holder i has its complete gradient (autograd's gradient-ready hook);
  // then unit u's last one on holder i.
  virtual void add_gradient(size_t /*k*/, size_t /*i*/) {}
  virtual void unit_gradients_done(size_t /*u*/, size_t /*i*/) {}
  // The unsharded parameters ([k] flattened), read from the shards (over ranks a collective), and
  // written into them: each holder takes its part of full[k] (a sharded checkpoint's parameters).
  virtual std::vector<std::vector<float>> parameters() const;
  virtual void set_parameters(const std::vector<std::vector<float>>& full);

 protected:
  // ZeRO's step, for every kind of holder and stage: each holder updates its own shard in place (the
  // optimizer on `mine`, the pieces this process holds, in one launch per device), then every
  // replica receives every shard's new values (all_gather; at stage 3 the next forward gathers).
  void update_my_shard_then_all_gather(const std::vector<ReplicaStep>& mine, const Step& s);
  // The all-gather of the pieces just updated: copies between this process's devices, or MPI's.
  virtual void all_gather() = 0;
};

}  // namespace zero
}  // namespace d2l::optim
