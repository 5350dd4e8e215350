// ZeRO stages 1, 2 and 3 (Rajbhandari et al., SC20, section 5; stage 3 as PyTorch's
// FullyShardedDataParallel, Zhao et al., VLDB 2023), wherever the shards live: the Trainer's
// {.zero_stage = 1, 2 or 3}. One class, one layout and one step for the three stages and every
// placement; the stages differ only in what stays whole between steps. The holders of the shards are
// the ranks of a group (kvstore dist_sync or dist_sync_ring: the world or a dp group), each rank's
// devices too (ShardOver::all_devices), or the devices of one process alone (kvstore 'device' or
// 'ring': a group of one, dist::Group::self(), below).
//
// The layout. The trainable parameters are cut into units, each laid end to end as one flat vector of
// P_u elements: at stages 1 and 2 one unit, the whole model in the Trainer's order (the paper's flat
// vector); at stage 3 the units FullyShardedDataParallel runs one at a time (core/optim/fsdp.hpp),
// each a FlatParameter. A unit is cut over the W ranks of the group by the one split rule
// (chunk_begin, core/comm.hpp): rank r keeps chunk r, [P_u r / W, P_u (r+1) / W), the split MPI's
// allgather and reduce_scatter are handed (core/dist/collectives.hpp). A process with several devices
// keeps the chunk on its first device (its devices are replicas of each other), or with over_devices
// (ShardOver::all_devices) as one piece a device: piece i of rank r is shard r h + i of W h (h
// devices a rank; the rule nests, so the pieces are the chunk). A piece is made of parts, each one
// tensor the update takes with its optimizer state (`slots` tensors): one part a parameter with
// elements in the piece. A parameter wholly inside it keeps its shape, and its values are its
// replica's buffer on the piece's device (updated in place; at stage 3 the buffer the replica is
// pointed at while gathered); a parameter shared with a neighbour's piece is updated through a copy
// of its part (at stage 3 kept, as the part's values).
//
// One step, every stage (step()): each part is updated by the same elementwise kernels as the
// replicated Trainer's (update_my_shard_then_all_gather, core/optim/shards.hpp), from its summed
// gradient; then
//   stages 1, 2  every parameter is all-gathered into its replica on the first device, straight from
//                the part that was updated (MPI_Allgatherv's counts: the part of it in each rank's
//                chunk; a whole parameter's part is the replica itself, gathered in place); with a
//                piece a device, holder by holder (below);
//   stage 3      nothing: the next forward gathers each unit (gather_unit), and releases it again.
// Where the summed gradient comes from:
//   stage 1 (P_os)    at the step, the .grad buffers reduce-scattered one parameter at a time, each
//                     straight into the part that holds its sum; the .grad buffers stay (4 Psi, what
//                     tells 1 from 2).
//                     With DDP's buckets (the kvstore all-reduced every gradient during backward)
//                     chunk r of that sum is read instead: an allreduce and an all-gather, 3 Psi.
//   stage 2 (P_os+g)  the same reduce-scatter, during backward, in buckets (DeepSpeed's
//                     reduce_bucket_size, DDP's bucket_cap_mb): the parameters taken from the last one
//                     back, consecutive ones in a bucket until it holds reduce_bucket_mb MiB (0: one a
//                     bucket). A bucket goes on the communication thread the moment autograd has
//                     completed its last gradient (the gradient-ready hook DDP's buckets use), packed
//                     end to end, and each .grad buffer is released once packed: between steps a rank
//                     keeps chunk r's sum (4 Psi_r in all, no .grad buffer), each piece's on its own
//                     device, one flat tensor a piece: a bucket is one reduce-scatter (one a holder)
//                     straight into the piece's sum; the step gives each part a copy of its range of
//                     it. A bucket sent twice in one step (gradient accumulation) is received apart
//                     and added in. The first step's backward runs before the chunk is laid out: its
//                     gradients go at the step.
//   stage 3 (P_os+g+p) per unit, once its last gradient is complete (FSDP's post-backward): each
//                     gradient reduce-scattered from its .grad buffer, this rank's part added into
//                     the pieces' summed gradients (several backward passes add up), the gradients
//                     and the unit's replicas released. The step zeroes the sums.
// A unit is whole at stage 3 only while it runs: dist::allgather_async of each parameter from the
// chunks into the buffer that becomes its replica, queued ahead by prefetch_unit (the transfer runs
// while the unit before computes); as FSDP's rate limiter, a new all-gather first waits until the
// device has passed the release of the unit two releases back.
//
// Sent per rank and step (dist::collective_counters' rule): stages 1 and 2 a reduce-scatter of Psi
// and an all-gather of chunk r, on average (W-1)/W of 2 * 4 Psi, data parallelism's volume (the
// paper's section 7); stage 3 two all-gathers and a reduce-scatter, 3 (W-1)/W * 4 Psi. MPI adds the W
// contributions of an element in rank order whatever the bucket around it: every bucket size gives
// the same bits, every rank ends with the same bits, and those of the replicated run wherever the
// sums are (2 ranks always: a + b = b + a).
//
// Several devices a rank. When they are replicas (the chunk on the first device), their gradients
// are summed on the first (device order) before the reduce-scatter, and the other devices copy the
// first's replicas after the all-gather. With a piece a device (over_devices), stages 1 and 2 run
// both collectives in two levels, as hierarchical data parallelism does: holder i's share of a
// bucket is its elements in piece i of every rank; device i sums that share over the rank's devices
// (device order: the devices' reduce-scatter, each device receiving (h-1)/h of the gradient), then
// reduce-scatters it over the group (rank r keeps its piece i); the all-gather is the reverse, each
// share gathered over the group on its device, then copied to the rank's other devices. The sums
// add the devices first, then the ranks, as the 'device' kvstore then MPI do in the replicated run.
// Stage 3 over ranks sums each device's gradients on the first device, and device i > 0 gets its
// replicas from the first device's (the first device is the hub there).
//
// A group of one: the devices of one process, a piece a device (piece i: shard i of N, over the
// whole model at stages 1 and 2, over each unit at stage 3). Nothing goes over the ranks, so no
// bucket waits:
//   stages 2, 3  each device's gradient is added into the parts holding its elements the moment
//                backward completes it (add_contribution; device order, the 'device' kvstore's bits)
//                and its .grad buffer released, a device's own whole parameter taking the buffer
//                over as its sum; the sums stay until the next gradient arrives;
//   stage 1      the step adds the .grad buffers up, a whole parameter of the first device's piece
//                in that device's buffer;
//   gather       stages 1 and 2 copy each updated part straight into the other replicas; stage 3
//                makes replica k on device i whole from every piece's part of it (gather_alone), a
//                parameter whole in device i's own piece by pointing the replica at the part.
// At N = 1 every stage holds what the replicated run holds. With replicate_over (HYBRID_SHARD) each
// part's sum is then all-reduced over a dp group.
//
// Fault injection, for tests: D2L_FAIL_RANK_IN_ALLGATHER=R makes rank R throw (a DeviceError) in the
// all-gather of its second step over a group of more than one (stage 3: the first all-gather of its
// second step), after its update, when the other ranks have entered it: a rank's own error
// (core/dist/process_group.hpp), so the program prints "error: rank R: ..." and aborts every rank.
// R:S limits it to stage S.
#pragma once
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/dist/collectives.hpp"
#include "core/optim/kvstore.hpp"
#include "core/optim/shards.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::optim::zero {

// Where every element of a flat vector lives: parameter k is [offsets[k], offsets[k + 1]), shard i
// is [bounds[i], bounds[i + 1]).
struct ShardLayout {
  std::vector<int64_t> offsets;  // one per parameter, and the total P last
  std::vector<int64_t> bounds;   // one per shard, and P last
  int64_t total() const { return offsets.empty() ? 0 : offsets.back(); }
  size_t shards() const { return bounds.empty() ? 0 : bounds.size() - 1; }
  int64_t shard_size(size_t i) const { return bounds[i + 1] - bounds[i]; }
};

// The layout for parameters of these element counts over n shards (n >= 1), by the one split rule.
ShardLayout shard_layout(const std::vector<int64_t>& sizes, size_t n);

// Whether D2L_FAIL_RANK_IN_ALLGATHER (above) asks this rank to fail in stage `stage`'s all-gather.
bool fails_in_allgather(int stage);

// The bytes of n floats: what the pieces' copies and memory rows count in.
inline size_t float_bytes(int64_t n) { return static_cast<size_t>(n) * sizeof(float); }

class RankShards : public Shards, NoCopy {
 public:
  // stage 1, 2 or 3. reduce_bucket_mb: stage 2's buckets (above), finite and >= 0 (a ConfigError
  // otherwise). group: the ranks that hold the shards (the world, or a grid's dp group: every
  // collective and the norm's sums are the group's). over_devices: a piece of the chunk a device.
  RankShards(size_t slots, int stage, double reduce_bucket_mb = 25, dist::Group group = dist::Group(),
             bool over_devices = false);
  ~RankShards() override;

  // The Trainer's step (above). in.weights[k]: parameter k's replicas on this process's devices, the
  // same devices in the same order for every parameter (a ConfigError otherwise, raised before any
  // collective). Stages 1 and 2 lay the chunk out when needed (the first step, a loaded state waiting
  // in in.host, the parameters moved); stage 3 places a loaded state. clip: clip_grad_norm_ over
  // every piece's summed gradient, the squares added over the group (dist::sum_over_ranks, a
  // collective; a tp_group's slices then added over it); null: off.
  void step(const StepInput& in, const Step& s, GradClip* clip) override;

  bool placed() const override { return !units_.empty(); }
  int stage() const override { return stage_; }
  std::vector<Device> devices() const override { return devices_; }
  Device device() const { return devices_.empty() ? Device{} : devices_[0]; }  // the chunk's
  // The state in the unsharded layout ([k][j]: parameter k's slot j, flattened), every chunk
  // all-gathered: a collective, every rank gets all of it. Empty before the layout (no rank communicates).
  std::vector<std::vector<std::vector<float>>> gather_state() const override;
  // Each piece's state, summed gradient and parameters, on its device; stage 2's chunk sum on the first.
  void add_memory(const std::function<DeviceMemory&(Device)>& at) const override;

  // Stage 3 (FullyShardedDataParallel's holders: this process's devices, i). The first call takes
  // this process's pieces out of the replicas (units[u]: the Trainer's indices of unit u's parameters)
  // and releases them; later calls place a loaded state, if one waits.
  void shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) override;
  const Tensor& replica(size_t k, size_t i) const override { return replicas_[k][i]; }
  void gather_unit(size_t u, size_t i) override;
  void prefetch_unit(size_t u, size_t i) override {
    if (alone()) gather_unit(u, i);  // copies between this process's devices: nothing to overlap
    else if (i == 0) start_gather(u);  // the other devices copy from the first when they need the unit
  }
  void release_unit(size_t u, size_t i) override;  // in stream order: queued kernels still read them
  bool gathered(size_t k, size_t i) const override { return replicas_[k][i].impl().storage != nullptr; }
  // Replica k's gradient on holder i complete: over a group of one added into the parts at once
  // (add_contribution) and released; over ranks kept for its unit's reduce-scatter.
  void add_gradient(size_t k, size_t i) override {
    if (alone()) add_contribution(k, i);
  }
  void unit_gradients_done(size_t u, size_t i) override;
  // The unsharded parameters ([k] flattened), every chunk all-gathered (a collective); and this
  // rank's pieces taken from full[k] (no communication).
  std::vector<std::vector<float>> parameters() const override;
  void set_parameters(const std::vector<std::vector<float>>& full) override;

  // Stages 1 and 2: the layout of the one unit over the group (sharded checkpoints,
  // core/checkpoint/sharded_checkpoint.hpp), this rank's chunk of the state without communication
  // (per slot, its elements [layout().bounds[rank], layout().bounds[rank + 1])), and the buckets'
  // parameter ranges [first, last) in launch order at the step. Empty before the first step.
  ShardLayout layout() const;
  std::vector<std::vector<float>> chunk_state() const;
  std::vector<std::pair<size_t, size_t>> buckets() const;
  // Stages 1 and 2: holder i's piece of the summed gradient (its parts end to end, zeros where none),
  // what stage 2 keeps between steps.
  std::vector<float> gradient_piece(size_t i) const;

  // FSDP's HYBRID_SHARD (the Trainer's ShardOver::devices), every stage, over a group of one with a
  // piece a device: every rank of `group` holds the same pieces over its own devices, and each
  // part's sum is all-reduced over the group before the update. Sharded inside a machine,
  // replicated across machines.
  void replicate_over(const dist::Group& group) { replicated_over_ = group; }

  // Elements of this rank's chunks, the bytes of the tensors it keeps (pieces' parameters, summed
  // gradients, state), and per unit its P_u.
  int64_t chunk() const;
  int64_t parameter_bytes() const;
  int64_t gradient_bytes() const;
  int64_t state_bytes() const;
  std::vector<int64_t> unit_sizes() const;

 private:
  // What one update kernel takes: one part per parameter with elements in the piece. A parameter
  // wholly inside it keeps its shape in the part (state, summed gradient) and its values are its
  // replica's buffer on the piece's device: at stages 1 and 2 updated in place, at stage 3 the
  // buffer the replica is pointed at while gathered (no copy, so at N = 1 sharding costs nothing). A
  // parameter the piece shares with another is updated through a copy of its part.
  struct Part {
    int64_t lo = 0, n = 0;      // elements [lo, lo + n) of the unit's flat vector
    size_t p = 0;               // the parameter (its place in the unit)
    bool whole = false;         // all of it
    Tensor param, grad;         // stage 3: kept; stages 1, 2: during the step only
    std::vector<Tensor> state;  // per slot, n elements
  };
  // Holder i's piece of a unit's chunk: [lo, lo + n) of the unit's flat vector, on device i.
  struct Piece {
    int64_t lo = 0, n = 0;
    std::vector<Part> parts;
  };
  struct Unit {
    std::vector<size_t> params;     // the Trainer's indices
    std::vector<int64_t> offsets;   // each parameter's first element in the unit's flat vector, P_u last
    int64_t lo = 0, n = 0;          // this rank's chunk: [lo, lo + n)
    std::vector<Piece> pieces;      // the chunk on the first device, or with over_devices one a device
    std::vector<Tensor> gathering;  // stage 3: per parameter, the buffer its queued all-gather writes
    std::vector<dist::Work> works;
    Tensor sending;                 // the chunk those all-gathers read
  };
  // Stage 2's bucket: parameters [first, last), consecutive in the flat vector, reduce-scattered in one call.
  struct Bucket {
    size_t first = 0, last = 0;
    // Per holder i, device i's share of their gradients summed over this rank's devices: the
    // elements in piece i of every rank, rank after rank (one holder: the bucket end to end, a lone
    // parameter's gradient itself).
    std::vector<Tensor> packed;
    size_t arrived = 0;  // parameters packed since the bucket was last sent
    int sent = 0;        // times sent this step
  };
  // A bucket's reduce-scatter on its way, one a holder: this rank's part of holder i's share,
  // elements [at, at + n) of the flat vector (inside piece i), arrives in `recv`. direct: recv is
  // where the sum is kept (stage 2: piece i's sum; stage 1: the one part the range is); else a
  // buffer (a bucket sent again in the step: gradient accumulation) added into the sums once there
  // (take, which then drops it).
  struct Receipt {
    dist::Work work;
    Tensor recv;
    size_t i = 0;
    int64_t at = 0, n = 0;
    bool add = false, direct = false, taken = false;
  };
  // Holder i's share of the flat range [a, b): per rank r of the group, in rank order, the elements
  // [lo, lo + n) of [a, b) in rank r's piece i, which start at `at` in the shares put end to end.
  // One holder: each rank's chunk of [a, b), the split of every collective.
  struct Segment {
    int64_t lo = 0, n = 0, at = 0;
  };
  std::vector<Segment> segments(size_t i, int64_t a, int64_t b) const;
  // A share's counts, rank by rank (what the collectives are handed), and their total.
  static std::vector<int64_t> counts(const std::vector<Segment>& share);
  static int64_t total(const std::vector<Segment>& share) { return share.back().at + share.back().n; }
  size_t slots_;
  int stage_;
  dist::Group group_;
  bool over_devices_;
  double bucket_mb_;
  std::vector<Device> devices_;                // this process's, in the replicas' order
  std::vector<std::vector<Tensor>> replicas_;  // [k][i]: parameter k on device i (stage 3: whole only while gathered)
  std::vector<Unit> units_;                    // stages 1, 2: one; stage 3: FSDP's
  std::vector<std::pair<size_t, size_t>> where_;  // per parameter: its unit and its place in it
  int64_t steps_ = 0;                          // steps taken, for the fault injection
  size_t holders() const { return over_devices_ ? devices_.size() : 1; }
  // A group of one (the devices of one process): nothing goes over the ranks, and at stages 2 and 3
  // each device's gradient is added into the parts the moment backward completes it, as no bucket
  // waits for other ranks (add_contribution).
  bool alone() const { return group_.size() == 1; }
  std::optional<dist::Group> replicated_over_;

  // The layout, the state and the all-gather: every stage's.
  std::vector<Device> devices_of(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names) const;
  Unit unit_of(const std::vector<size_t>& params) const;
  void place_state(const std::vector<std::string>& names, std::vector<std::vector<std::vector<float>>>& host);
  // The part's elements taken from full(k), parameter k unsharded (zeros where it is empty).
  std::vector<float> from_host(const Unit& unit, const Part& part,
                               const std::function<const std::vector<float>&(size_t)>& full) const;
  Shape part_shape(const Unit& unit, const Part& part) const;
  // A field of the unit's parts end to end on the first device: the chunk (a flat part itself when one).
  Tensor chunk_on_first(const Unit& unit, const std::function<const Tensor&(const Part&)>& field) const;
  // The unit's elements [lo, lo + flat.numel()) copied out of device i's replicas into flat, or back.
  void copy_flat(const Unit& unit, size_t i, int64_t lo, const Tensor& flat, bool into_replicas) const;
  // Each of the unit's parameters all-gathered from the ranks' chunks into into[p], this rank's read
  // from `chunk` (undefined: from the parts of the one piece).
  std::vector<dist::Work> all_gather_unit(const Unit& unit, const Tensor& chunk, const std::vector<Tensor>& into) const;
  Step clipped(const Step& s, GradClip* clip) const;

  // Stages 1 and 2: the chunk laid out, the gradients reduce-scattered into it.
  const std::vector<int64_t>& offsets() const { return units_[0].offsets; }  // the one unit's: every parameter's
  std::vector<Bucket> buckets_;                           // in launch order at the step
  std::vector<size_t> bucket_of_;                         // per parameter
  std::vector<bool> packed_;                              // per parameter: in its bucket, not yet sent
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> index_;  // replica -> (parameter, device)
  std::vector<size_t> completed_;                         // stage 2, per parameter: replicas whose gradient is complete
  // The reduce-scatters launched this step, in order. Stage 2's rate limiter (FSDP's
  // limit_all_gathers, for gradients): a released .grad buffer is in use until its reduce-scatter
  // has read it, so backward waits once more than kInFlight buckets (each one reduce-scatter a
  // holder) are on their way; without it a host running ahead of the devices holds every gradient at
  // once. With a piece a device the same holds at stage 1: each share sent is a packed copy.
  static constexpr size_t kInFlight = 2;
  std::deque<Event> in_flight_;     // the buckets' reduce-scatters the limiter waits for
  std::vector<Receipt> receipts_;   // this step's, in order
  std::vector<Tensor> sums_;  // stage 2: piece i's summed gradient, flat, on device i, kept between steps
  int hook_ = -1;
  bool fits(const std::vector<std::vector<Tensor>>& weights) const;
  void place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             std::vector<std::vector<std::vector<float>>>& host);
  void sum_into_pieces(const StepInput& in);
  // A group of one: device j's gradient of parameter k into the parts (stages 2 and 3, during
  // backward), and every part's sum at the step; the parts' sums end to end (the parameters moved
  // mid-step).
  bool stale_ = false;     // the parts' sums are the last step's: dropped when the next gradient arrives
  bool received_ = false;  // a gradient was added in since the last step
  void add_contribution(size_t k, size_t j);
  void sum_alone();
  std::vector<float> flat_sums() const;
  void make_buckets();
  void pack(size_t k, bool release);
  Tensor device_sum(size_t k) const;  // parameter k's gradient summed over this rank's devices, on the first
  // Elements [lo, lo + n) of parameter k's gradient summed over this rank's devices in device order, on device d.
  Tensor device_sum(size_t k, int64_t lo, int64_t n, Device d) const;
  void send(Bucket& b);
  Part* part_at(size_t i, int64_t at, int64_t n);  // the part of piece i that is exactly [at, at + n), if one
  Tensor sum_of(Part& part, Device d);     // the part's summed gradient, made on d when it has none
  int64_t received_bytes(size_t i) const;  // of the receipts not yet taken, on holder i's device
  void take(Receipt& r);                   // a receipt's sum into its parts (stage 2: pieces), once
  void reduce_scatter_rest(bool release);
  void wait_for_sums();
  void all_gather() override;

  // Stage 3: a unit made whole and released, its gradients reduce-scattered.
  std::deque<Event> released_;  // the compute stream's points where the last units were released
  void shard(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
             const std::vector<std::vector<size_t>>& units, std::vector<std::vector<std::vector<float>>>& host);
  void start_gather(size_t u);
  void gather(size_t u);
  void gather_alone(size_t u, size_t i);  // a group of one: each holder's parts copied in, or aliased
  void reduce_scatter_gradients(size_t u);
};

}  // namespace d2l::optim::zero
