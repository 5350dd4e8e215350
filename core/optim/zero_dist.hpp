// ZeRO stages 1 and 2 over the processes of the world (Rajbhandari et al., SC20, sections 5.1 and
// 5.2), the Trainer's {.zero_stage = 1} and {.zero_stage = 2} with kvstore dist_sync or
// dist_sync_ring: the paper's setting, one device per data-parallel process.
//
// core/optim/zero.hpp shards the optimizer state over the devices of one process. Here the shards
// are the ranks: the trainable parameters, in the Trainer's order, laid end to end are one flat
// vector of P elements, cut into W chunks by dist::chunk_begin (rank r keeps
// [P r / W, P (r+1) / W), the split core/dist/collectives.hpp's allgather and reduce_scatter use, so
// the chunks go to MPI as they are). Rank r keeps the optimizer state of chunk r only, and a step is
//   stage 1 (P_os)    the gradients all-reduced over the ranks as in data parallelism (the
//                     kvstore's pushpull, or DDP's buckets during backward); rank r copies chunk r of
//                     the weights and of the summed gradient into flat buffers, runs the optimizer on
//                     them with its flat state, then dist::allgather of the updated chunks gives every
//                     rank the whole updated vector, which is copied back into the parameters;
//   stage 2 (P_os+g)  each parameter's gradient reduce-scattered during backward, the moment autograd
//                     completes it (the gradient-ready hook DDP's buckets use), asynchronously on the
//                     communication thread: the part of it that lies in chunk r goes to rank r
//                     (MPI_Reduce_scatter with uneven counts), so rank r receives the summed gradient of
//                     chunk r alone (a buffer of the chunk's size it keeps) while backward goes on;
//                     the step waits for them, then the same update and all-gather. (The first step's
//                     backward runs before the chunks are laid out: its gradients go at the step.)
// Each element is updated once, on one rank, by the same elementwise kernels as at stage 0, so every
// rank ends with the same bits, and those of the replicated run wherever the sums are the same bits
// (stage 1 always: it reads the replicated run's allreduce).
//
// Fault injection, for tests: D2L_FAIL_RANK_IN_ALLGATHER=R makes rank R throw (a DeviceError) in
// the all-gather of its second step, after its update and before it joins the collective, which the
// other ranks have entered: it is a rank's own error (core/dist/process_group.hpp), so the program
// prints "error: rank R: ..." and aborts every rank. R:S limits it to stage S's all-gather
// (R:3, ZeRO-3's, core/optim/fsdp_dist.hpp).
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dist/collectives.hpp"

#include "core/optim/kvstore.hpp"
#include "core/optim/zero.hpp"
#include "core/tensor.hpp"

namespace d2l::optim::zero {

// Whether D2L_FAIL_RANK_IN_ALLGATHER (above) asks this rank to fail in stage `stage`'s all-gather.
bool fails_in_allgather(int stage);

// The layout of P elements, parameters of these sizes, over the ranks: bounds[r] = chunk_begin(P, r).
ShardLayout rank_layout(const std::vector<int64_t>& sizes);

class RankShardedState {
 public:
  RankShardedState(size_t slots, int stage);
  ~RankShardedState();
  RankShardedState(const RankShardedState&) = delete;
  RankShardedState& operator=(const RankShardedState&) = delete;

  // One step: lays the chunk out when needed (the first step, a loaded state waiting in host[k][j],
  // the parameters moved), then stage 1's or stage 2's step above. weights[k] must be one replica
  // (this process's one device, the same for every parameter): a ConfigError otherwise, raised
  // before any collective. summed: the gradients already hold the sum (buckets; stage 1 only).
  void step(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
            std::vector<std::vector<std::vector<float>>>& host, KVStore& kv, bool summed, const Step& s);

  bool placed() const { return placed_; }
  int stage() const { return stage_; }
  const ShardLayout& layout() const { return layout_; }
  Device device() const { return device_; }
  // The state in the unsharded layout ([k][j]: parameter k's slot j, flattened), every rank's chunk
  // all-gathered: a collective, every rank calls it and every rank gets the whole state. Empty
  // before the first step (then no rank communicates).
  std::vector<std::vector<std::vector<float>>> gather() const;
  // Bytes of state this rank holds: slots * 4 * its chunk's size (Adam: 8 * chunk).
  int64_t bytes() const;
  // Stage 2: the bytes of the chunk's summed gradient it keeps, 4 * chunk (0 at stage 1).
  int64_t gradient_bytes() const;

 private:
  size_t slots_;
  int stage_;
  bool placed_ = false;
  ShardLayout layout_;
  Device device_;
  std::vector<Tensor> state_;  // per slot, the chunk's state, flat
  Tensor grad_shard_;          // stage 2: the chunk's summed gradient
  int64_t steps_ = 0;          // steps taken, for the fault injection
  // Stage 2 during backward: each parameter's gradient, the moment autograd completes it, is
  // reduce-scattered into grad_shard_ (its part of chunk r to rank r) on the communication thread.
  std::vector<Tensor> replicas_;                          // per parameter, this rank's replica
  std::unordered_map<const TensorImpl*, size_t> index_;  // replica -> parameter
  std::vector<bool> scattered_;                           // per parameter, this step
  std::vector<dist::Work> pending_;                       // the reduce-scatters launched this step
  int hook_ = -1;
  void scatter(size_t k);
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);
  int64_t lo() const;
  int64_t chunk() const;
};

}  // namespace d2l::optim::zero
