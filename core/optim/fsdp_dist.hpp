// ZeRO stage 3 over the processes of a group, by default the world (Rajbhandari et al., SC20, section 5.3, P_os+g+p;
// PyTorch's FullyShardedDataParallel, Zhao et al., VLDB 2023): the Trainer's {.zero_stage = 3} with
// kvstore dist_sync or dist_sync_ring, one device per rank (or several, below), run through
// optim::FullyShardedDataParallel (core/optim/fsdp.hpp) exactly as across the devices of one process:
//
//   optim::Trainer trainer(net->collect_params(), "adam", {.learning_rate = 1e-3f, .zero_stage = 3}, "dist_sync");
//   optim::FullyShardedDataParallel fsdp(net, trainer);   // every rank keeps its chunks only from here on
//   auto out = fsdp({X});                                 // X: this rank's rows of the global batch
//   loss(out[0], y).backward();
//   trainer.step(global_batch_size);
//
// The flat vectors are per unit, as FSDP's FlatParameter is: unit u's parameters (a top-level child
// of the net) laid end to end are P_u elements, cut into W chunks by the one split rule (chunk_begin,
// core/comm.hpp), so rank r keeps [P_u r / W, P_u (r+1) / W) of every unit (the split MPI's allgather
// and reduce-scatter are given). W and r are the group's: the Trainer's dp_group (a grid's column, or
// any group of ranks that share a model), else the world; every collective runs over it. For each unit rank r keeps its chunk of the parameters, of the summed gradient and of the
// optimizer state, nothing else: between steps 4 + 4 + 8 bytes an element of its chunks with Adam,
// the paper's 16 Psi / N_d. A unit is made whole only while it runs:
//   forward   dist::allgather of the unit's chunks into a flat buffer of P_u, copied into the unit's
//             replicas (a Tensor owns its memory: the replicas cannot be views of the buffer), the
//             unit's forward, the replicas released;
//   backward  the pre-backward hook gathers the unit again; once every gradient of the unit is
//             complete (autograd's gradient-ready hook, counted per unit) they are packed end to end
//             into a flat buffer and dist::reduce_scatter'ed: rank r receives the sum over the ranks
//             of its chunk, which it adds into the chunk's summed gradient (so several backward passes
//             before a step add up); the full gradients and the replicas are released;
//   step      rank r updates its chunks in place with the same elementwise kernels as every other
//             stage (step_on_device), from the summed gradient, which is then zeroed. Nothing is
//             gathered: the next forward does.
// Prefetch queues unit u+1's all-gather before unit u's compute (u-1's in backward): the all-gather
// is stream work on the communication thread and the compute stream waits for it only when the unit
// is made whole (dist::allgather_async), so the transfer runs while unit u computes.
// A step moves per rank about 3 (W-1)/W * 4 Psi bytes: two all-gathers and one reduce-scatter.
// The host only enqueues, and runs ahead of the device: left alone it would gather every unit before
// the first one has computed, and hold them all. As FSDP's rate limiter does, a new all-gather first
// waits (the host) until the device has passed the release of the unit two releases back: at most
// about two units are whole at once, whatever the host's lead.
//
// The replicas must start equal on every rank (the same seed), as data parallelism needs: each rank
// takes its chunks from its own replica.
//
// Fault injection, for tests: D2L_FAIL_RANK_IN_ALLGATHER=R:3 (or R, core/optim/zero_dist.hpp) makes
// rank R throw (a DeviceError) in the first all-gather of its second step, which the other ranks have
// entered: "error: rank R: ..." and every rank aborts.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/collectives.hpp"
#include "core/optim/kvstore.hpp"
#include "core/optim/shards.hpp"
#include "core/tensor.hpp"

namespace d2l::optim::zero {

class RankParameterShards : public Shards {
 public:
  // group: the ranks that hold the shards (the world, or a dp group). over_devices
  // (ShardOver::all_devices): each of a process's k devices keeps its own piece of the rank's chunks,
  // shard r k + i of W k of every unit (the one split rule nests: the pieces are the chunk); the
  // all-gathers and reduce-scatters over the ranks stay the chunk's, through the first device.
  explicit RankParameterShards(size_t slots, dist::Group group = dist::Group(), bool over_devices = false)
      : slots_(slots), group_(std::move(group)), over_devices_(over_devices) {}

  // The first call: weights[k] are parameter k's replicas (on this process's devices, the same for
  // every parameter; a ConfigError otherwise, before any collective), units[u] the Trainer's
  // indices of unit u's parameters. Rank r copies its chunk of every unit out of its replicas and
  // releases them; the state is placed from host (host[k][j]: parameter k's slot j unsharded, loaded
  // values) or zeros. Later calls keep the parameters' chunks and the state, unless a loaded state
  // waits in host, which then replaces it.
  void shard(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             const std::vector<std::vector<size_t>>& units, std::vector<std::vector<std::vector<float>>>& host);
  // FullyShardedDataParallel's holders (core/optim/shards.hpp): this process's devices, i. The rank's
  // chunk lives on the first; device i > 0 holds copies of a unit while it runs (gather_unit copies
  // them from the first device, gathering there first when needed), and its gradients are
  // reduce-scattered on their own as they complete, added into the chunk's sum as a second backward
  // pass's are (k devices: k reduce-scatters a unit and up to k all-gathers in backward).
  void shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) override {
    shard(in.weights, in.names, units, in.host);
  }
  bool placed() const override { return !units_.empty(); }
  int stage() const override { return 3; }
  Device device() const { return devices_.empty() ? Device{} : devices_[0]; }
  std::vector<Device> devices() const override { return devices_; }
  const Tensor& replica(size_t k, size_t i) const override { return replicas_[k][i]; }
  void gather_unit(size_t u, size_t i) override;
  void prefetch_unit(size_t u, size_t i) override {
    if (i == 0) start_gather(u);  // the other devices copy from the first when they need the unit
  }
  // Device i's replicas of unit u: their memory and gradients handed back (in stream order: queued
  // kernels still read them).
  void release_unit(size_t u, size_t i) override;
  bool gathered(size_t k, size_t i) const override { return replicas_[k][i].impl().storage != nullptr; }
  void unit_gradients_done(size_t u, size_t i) override;

  // Collectives (every rank calls them in the same order): the unit's all-gather queued, one per
  // parameter straight into the buffer that becomes its replica (nothing when already queued or
  // whole); the unit whole (its all-gathers waited for, the buffers handed to the replicas).
  void start_gather(size_t u);
  void gather(size_t u);
  // The unit's gradients, complete: each reduce-scattered from its .grad buffer as it is (no packing),
  // this rank's chunk of the sum added into the chunk's summed gradient; the gradients released. A
  // collective.
  void reduce_scatter_gradients(size_t u);
  // The Trainer's step: rank r updates its chunks in place, then zeroes their summed gradient (a
  // loaded state waiting in in.host placed first). Every replica is released first.
  // clip: clip_grad_norm_ (GradClip) over every unit's chunk on every rank (dist::sum_over_ranks, a
  // collective); null: off.
  void step(const StepInput& in, const Step& s, GradClip* clip) override;

  // The unsharded parameters ([k] flattened) and state ([k][j]), every chunk all-gathered: collectives,
  // every rank gets all of it. Empty before shard() (then no rank communicates).
  std::vector<std::vector<float>> parameters() const override;
  std::vector<std::vector<std::vector<float>>> gather_state() const override;
  // This rank's chunk of every unit taken from full[k] (no communication).
  void set_parameters(const std::vector<std::vector<float>>& full) override;

  // Elements of this rank's chunks over the units, and the bytes of the tensors it keeps between
  // steps (its chunks' parameters, summed gradients and state), added to its device's row.
  int64_t chunk() const;
  int64_t parameter_bytes() const;
  int64_t gradient_bytes() const;
  int64_t state_bytes() const;
  void add_memory(const std::function<DeviceMemory&(Device)>& at) const override;
  // Per unit, its P_u; for tests and the chapter's formulas.
  std::vector<int64_t> unit_sizes() const;

 private:
  // Holder i's piece of a unit's chunk: [lo, lo + n) of the unit's flat vector, on device i.
  struct Piece {
    int64_t lo = 0, n = 0;
    Tensor param, grad;         // the piece's parameters and summed gradient (n elements)
    std::vector<Tensor> state;  // per slot, n elements
  };
  struct Unit {
    std::vector<size_t> params;    // the Trainer's indices
    std::vector<int64_t> offsets;  // each parameter's first element in the unit's flat vector, P_u last
    int64_t lo = 0, n = 0;         // this rank's chunk: [lo, lo + n)
    std::vector<Piece> pieces;     // the whole chunk on the first device, or with over_devices one a device
    std::vector<Tensor> gathering;  // per parameter, the buffer its all-gather is writing (queued, not yet waited for)
    std::vector<dist::Work> works;
    Tensor sending;                 // the chunk those all-gathers read (the pieces end to end, on the first device)
  };
  size_t slots_;
  dist::Group group_;
  bool over_devices_;
  size_t holders() const { return over_devices_ ? devices_.size() : 1; }
  // A field of the unit's pieces end to end on the first device: the chunk (the piece itself when one).
  Tensor chunk_on_first(const Unit& unit, const std::function<const Tensor&(const Piece&)>& field) const;
  std::vector<Device> devices_;  // this process's, the chunks (or the first device's pieces) on the first
  std::vector<std::vector<Tensor>> replicas_;  // [k][i]: parameter k on device i, whole only while its unit is gathered there
  std::vector<Unit> units_;
  int64_t steps_ = 0;            // steps taken, for the fault injection
  std::deque<Event> released_;   // the compute stream's points where the last units were released
  void place_state(const std::vector<std::string>& names, std::vector<std::vector<std::vector<float>>>& host);
  void all_gather() override {}  // stage 3 gathers a unit at its next forward (start_gather, gather)
};

}  // namespace d2l::optim::zero
