// ZeRO stages 1 and 2 over the processes of the world (Rajbhandari et al., SC20, sections 5.1 and
// 5.2), the Trainer's {.zero_stage = 1} and {.zero_stage = 2} with kvstore dist_sync or
// dist_sync_ring: the paper's setting, one device per data-parallel process. A process may have
// several devices: they are replicas of each other, their gradients summed on the first one (device
// order) before the reduce-scatter, the chunk's state and update on that first device, and the
// all-gathered values copied from it into the others (the reverse of ShardOver::devices' layout). With
// over_devices (ShardOver::all_devices) the state is split further, over those devices: device i of
// rank r keeps shard r k + i of W k, and updates it with its piece of the rank's summed chunk.
//
// core/optim/zero.hpp shards the optimizer state over the devices of one process. Here the shards
// are the ranks: the trainable parameters, in the Trainer's order, laid end to end are one flat
// vector of P elements, cut into W chunks by dist::chunk_begin (rank r keeps
// [P r / W, P (r+1) / W), the split core/dist/collectives.hpp's allgather and reduce_scatter use, so
// the chunks go to MPI as they are). Rank r keeps the optimizer state of chunk r only, and a step is
//   stage 1 (P_os)    at the step, the gradients reduce-scattered (MPI_Reduce_scatter with uneven
//                     counts, bucket by bucket, below): rank r receives the summed gradient of chunk r
//                     only, into a buffer of the chunk's size; the .grad buffers stay (4 Psi, what
//                     tells stage 1 from 2). Rank r copies chunk r of the weights into a flat buffer,
//                     runs the optimizer on it with its flat state, then dist::allgather of the updated
//                     chunks gives every rank the whole updated vector, copied back into the parameters;
//   stage 2 (P_os+g)  the same reduce-scatter, during backward: each bucket goes on the communication
//                     thread the moment autograd has completed its last gradient (the gradient-ready
//                     hook DDP's buckets use), while backward goes on, and each .grad buffer is released
//                     once packed into its bucket, the bucket's buffer once the reduce-scatter has read
//                     it: between steps a rank keeps chunk r's sum (4 Psi_r), no .grad buffer. The step
//                     waits for the buckets, then the same update and all-gather. (The first step's
//                     backward runs before the chunks are laid out: its gradients go at the step.)
// Sent per rank and step (dist::collective_counters' rule): a reduce-scatter of Psi elements and an
// all-gather of chunk r, 4 (Psi - Psi_r) + 4 Psi_r (W-1) bytes, over the ranks 2 (W-1) 4 Psi: on
// average (W-1)/W of 2 * 4 Psi, data parallelism's volume (the paper's section 7). Stage 1 with DDP's
// buckets (`summed`: every gradient all-reduced during backward) reads chunk r of that sum instead
// and then all-gathers: an allreduce and an all-gather, 3 Psi (W-1)/W per rank.
//
// Buckets (DeepSpeed's reduce_bucket_size, DDP's bucket_cap_mb): the parameters taken from the last
// one back (backward completes them roughly in that order), consecutive ones in one bucket until it
// holds reduce_bucket_mb MiB of gradients (0: one parameter a bucket). A bucket's parameters are
// consecutive in the flat vector, so the elements rank r receives from it are one range of chunk r,
// and one MPI_Reduce_scatter with uneven counts serves the whole bucket. Its gradients are packed end
// to end into one buffer (a lone parameter's gradient is sent as it is). MPI adds the W contributions
// of an element in the same rank order whatever the bucket around it: every bucket size gives the
// same bits. Every rank launches the buckets in the same order: the order backward completes them,
// the same on every rank when the nets are, and at the step those still waiting in bucket order.
// Gradient accumulation (several backward passes before a step) works at stage 2: a bucket sent
// again in the same step is received into a buffer of its own and added into the chunk's sum.
//
// Each element is updated once, on one rank, by the same elementwise kernels as at stage 0, so every
// rank ends with the same bits, and those of the replicated run wherever the sums are the same bits
// (2 ranks always: a + b = b + a; from 3 ranks on the reduce-scatter may add the ranks in another
// order than the allreduce).
//
// Fault injection, for tests: D2L_FAIL_RANK_IN_ALLGATHER=R makes rank R throw (a DeviceError) in
// the all-gather of its second step, after its update and before it joins the collective, which the
// other ranks have entered: it is a rank's own error (core/dist/process_group.hpp), so the program
// prints "error: rank R: ..." and aborts every rank. R:S limits it to stage S's all-gather
// (R:3, ZeRO-3's, core/optim/fsdp_dist.hpp).
#pragma once
#include <cstdint>
#include <deque>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dist/collectives.hpp"

#include "core/optim/kvstore.hpp"
#include "core/optim/zero.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::optim::zero {

// Whether D2L_FAIL_RANK_IN_ALLGATHER (above) asks this rank to fail in stage `stage`'s all-gather.
bool fails_in_allgather(int stage);


class RankShardedState : public Shards, NoCopy {
 public:
  // reduce_bucket_mb: the buckets' size in MiB (above), >= 0; a ConfigError otherwise.
  // group: the ranks that hold the shards (the world, or a grid's dp group: the layout, the
  // reduce-scatters, the all-gathers and the norm's sums are the group's).
  // over_devices: every device of the process holds its own shard of the rank's chunk (above).
  RankShardedState(size_t slots, int stage, double reduce_bucket_mb = 25, dist::Group group = dist::Group(),
                   bool over_devices = false);
  ~RankShardedState() override;

  // One step (core/optim/shards.hpp): lays the chunk out when needed (the first step, a loaded state
  // waiting in in.host[k][j], the parameters moved), then stage 1's or stage 2's step above.
  // in.weights[k]: parameter k's replicas on this process's devices, the same devices in the same
  // order for every parameter (a ConfigError otherwise, raised before any collective). With several
  // devices the shards are still the ranks (the reverse of ShardOver::devices): the devices' gradients are
  // summed on the first one, in device order, before the reduce-scatter; the rank's chunk of the state
  // lives on that first device (over_devices: split over the devices, each updating its piece); the
  // all-gather fills its replicas, copied from there into the others. The kvstore's buckets may have summed the
  // gradients already (stage 1 only): then chunk r of that sum is read.
  // clip: clip_grad_norm_ (GradClip) over every rank's chunk of the sum (dist::sum_over_ranks of the
  // chunks' squares over the group, a collective; a tp_group's slices then added over it); null: off.
  void step(const StepInput& in, const Step& s, GradClip* clip) override;

  bool placed() const override { return placed_; }
  int stage() const override { return stage_; }
  const ShardLayout& layout() const { return layout_; }
  // The device holding the chunk: the first of this process's devices.
  Device device() const { return replica_devices_.empty() ? Device{} : replica_devices_[0]; }
  std::vector<Device> devices() const override;
  // The state in the unsharded layout ([k][j]: parameter k's slot j, flattened), every rank's chunk
  // all-gathered: a collective, every rank calls it and every rank gets the whole state. Empty
  // before the first step (then no rank communicates).
  std::vector<std::vector<std::vector<float>>> gather_state() const override;
  // This rank's chunk of the state (on its first device, or its pieces on each device with
  // over_devices) and, at stage 2, of the summed gradient (on the first device).
  void add_memory(const std::function<DeviceMemory&(Device)>& at) const override;
  // This rank's chunk of the state, without communication: per slot the values of elements
  // [layout().bounds[rank], layout().bounds[rank + 1]) of the flat vector (sharded checkpoints,
  // core/checkpoint/sharded_checkpoint.hpp). Empty before the first step.
  std::vector<std::vector<float>> chunk_state() const;
  // Bytes of state this rank holds: slots * 4 * its chunk's size (Adam: 8 * chunk).
  int64_t bytes() const;
  // Stage 2: the bytes of the chunk's summed gradient it keeps, 4 * chunk (0 at stage 1, whose
  // buffer for it lives during the step only).
  int64_t gradient_bytes() const;
  // The buckets' parameter ranges [first, last) in the Trainer's order, in launch order at the step
  // (empty before the first step).
  std::vector<std::pair<size_t, size_t>> buckets() const;

 private:
  size_t slots_;
  int stage_;
  dist::Group group_;
  bool placed_ = false;
  ShardLayout layout_;
  std::vector<Device> replica_devices_;  // this process's devices, in the replicas' order
  bool over_devices_;
  // [i][slot]: holder i's piece of the chunk's state, flat, on device i: one holder (the whole chunk
  // on the first device), or every device with over_devices_.
  std::vector<std::vector<Tensor>> state_;
  Tensor grad_shard_;          // the chunk's summed gradient (stage 1: during the step only)
  int64_t steps_ = 0;          // steps taken, for the fault injection
  double bucket_mb_;
  // Parameters [first, last), consecutive in the flat vector, reduce-scattered in one call.
  struct Bucket {
    size_t first = 0, last = 0;
    Tensor packed;       // their gradients end to end (a lone parameter's: its gradient itself)
    size_t arrived = 0;  // parameters packed since the bucket was last sent
    int sent = 0;        // times sent this step
  };
  // A bucket sent again in one step (gradient accumulation): its part of chunk r lands in `recv`,
  // added into grad_shard_ from element `at` once the reduce-scatter is done.
  struct Late {
    dist::Work work;
    Tensor recv;
    int64_t at = 0;
  };
  std::vector<Bucket> buckets_;                           // in launch order at the step
  std::vector<size_t> bucket_of_;                         // per parameter
  std::vector<bool> packed_;                              // per parameter: in its bucket, not yet sent
  std::vector<std::vector<Tensor>> replicas_;             // [k][i]: parameter k on this rank's device i
  std::unordered_map<const TensorImpl*, size_t> index_;  // replica -> parameter
  std::vector<size_t> completed_;                         // stage 2, per parameter: replicas whose gradient is complete
  std::vector<dist::Work> pending_;                       // the reduce-scatters launched this step
  // Stage 2's rate limiter (FSDP's limit_all_gathers, for gradients): a released .grad buffer is still
  // in use until its reduce-scatter has read it, so backward waits once more than kInFlight buckets
  // are on their way; without it a host running ahead of the devices holds every gradient at once.
  static constexpr size_t kInFlight = 2;
  std::deque<Event> in_flight_;
  std::vector<Late> late_;
  int hook_ = -1;
  // This step's updated chunk, flat, and the parameters the all-gather writes it into.
  Tensor gather_from_;
  std::vector<Tensor> gather_into_;
  std::vector<std::pair<Tensor, int64_t>> updated_pieces_;  // over_devices_: each device's updated piece, its offset in the chunk
  void all_gather() override;
  void make_buckets();
  void pack(size_t k, bool release);
  Tensor device_sum(size_t k) const;  // parameter k's gradient summed over this rank's devices, on the first
  void send(Bucket& b);
  void reduce_scatter_rest(bool release);
  void wait_for_sums();
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);
  int64_t lo() const;
  int64_t chunk() const;
  size_t holders() const { return over_devices_ ? replica_devices_.size() : 1; }
  int64_t piece_begin(size_t i) const;  // holder i's piece of the chunk: [piece_begin(i), piece_begin(i + 1)), flat
  Tensor chunk_of_slot(size_t j) const;  // the chunk's state of slot j, flat, on the first device
};

}  // namespace d2l::optim::zero
