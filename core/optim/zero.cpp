// The layout, the state, the step and stages 1 and 2's reduce-scatter over the ranks; stage 3's unit
// gathers and releases, which FullyShardedDataParallel calls, are in zero_fsdp.cpp.
#include "core/optim/zero.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

namespace d2l::optim::zero {

namespace {

int64_t bytes_held(const Tensor& t) {
  return t.defined() && t.impl().storage ? static_cast<int64_t>(float_bytes(t.numel())) : 0;
}

// Calls f(p, a, b) for every parameter p of a unit (its place in the unit) with elements in the
// unit's flat range [lo, hi): [a, b) those elements, in the unit's flat numbering.
template <class F>
void each_piece_between(const std::vector<int64_t>& offsets, int64_t lo, int64_t hi, F f) {
  for (size_t p = 0; p + 1 < offsets.size(); ++p) {
    const int64_t a = std::max(lo, offsets[p]), b = std::min(hi, offsets[p + 1]);
    if (a < b) f(p, a, b);
  }
}

// dst's elements [at, at + src.numel()) += src's (gradient accumulation: a bucket packed or sent twice).
void add_at(const Tensor& dst, int64_t at, const Tensor& src) {
  Tensor part = Tensor::empty(src.shape(), dst.device());
  copy_bytes(dst, float_bytes(at), part, 0, float_bytes(src.numel()));
  add_(part, src);
  copy_bytes(part, 0, dst, float_bytes(at), float_bytes(src.numel()));
}

}  // namespace

ShardLayout shard_layout(const std::vector<int64_t>& sizes, size_t n) {
  ShardLayout l;
  l.offsets.push_back(0);
  for (int64_t s : sizes) l.offsets.push_back(l.offsets.back() + s);
  const int64_t total = l.offsets.back(), count = static_cast<int64_t>(n);
  l.bounds.push_back(0);
  for (int64_t i = 1; i <= count; ++i) l.bounds.push_back(chunk_begin(total, i, count));  // core/comm.hpp's one rule
  return l;
}

bool fails_in_allgather(int stage) {
  const char* v = std::getenv("D2L_FAIL_RANK_IN_ALLGATHER");
  if (!v || !*v) return false;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  if (end == v || r != dist::rank()) return false;
  if (*end == '\0') return true;  // R: whichever sharded stage runs first
  if (*end != ':') return false;
  const char* s = end + 1;
  const long only = std::strtol(s, &end, 10);
  return end != s && *end == '\0' && only == stage;  // R:S: stage S's only
}

RankShards::RankShards(size_t slots, int stage, double reduce_bucket_mb, dist::Group group, bool over_devices)
    : slots_(slots), stage_(stage), group_(std::move(group)), over_devices_(over_devices), bucket_mb_(reduce_bucket_mb) {
  if (!(reduce_bucket_mb >= 0) || !std::isfinite(reduce_bucket_mb))
    throw ConfigError("Trainer: reduce_bucket_mb must be finite and >= 0 (0: one reduce-scatter per parameter), got " +
                      std::to_string(reduce_bucket_mb));
  if (stage_ == 2)  // backward packs each gradient the moment it is complete on every device, and sends full buckets
    hook_ = add_grad_ready_hook([this](TensorImpl& leaf) {
      auto it = index_.find(&leaf);
      if (!placed() || it == index_.end()) return;
      const auto [k, j] = it->second;
      if (alone()) return add_contribution(k, j);  // a group of one: straight into the parts
      if (++completed_[k] < devices_.size()) return;  // the devices run backward one after another
      completed_[k] = 0;
      pack(k, true);
    });
}

RankShards::~RankShards() {
  if (hook_ >= 0) remove_grad_ready_hook(hook_);
}

// ---- The layout, the state and the all-gather: every stage's ----

std::vector<Device> RankShards::devices_of(const std::vector<std::vector<Tensor>>& weights,
                                           const std::vector<std::string>& names) const {
  return common_devices(weights, names, stage_, dist::world_size() > 1 ? " in rank " + std::to_string(dist::rank()) : "");
}

RankShards::Unit RankShards::unit_of(const std::vector<size_t>& params) const {
  Unit unit;
  unit.params = params;
  unit.offsets.push_back(0);
  for (size_t k : params) unit.offsets.push_back(unit.offsets.back() + replicas_[k][0].numel());
  const int64_t P = unit.offsets.back(), h = static_cast<int64_t>(holders()), W = group_.size(), r = group_.rank();
  unit.lo = dist::chunk_begin(P, static_cast<int>(r), group_);
  unit.n = dist::chunk_begin(P, static_cast<int>(r + 1), group_) - unit.lo;
  for (int64_t i = 0; i < h; ++i) {  // holder i's piece: shard r h + i of W h
    Piece piece;
    piece.lo = chunk_begin(P, r * h + i, W * h);
    piece.n = chunk_begin(P, r * h + i + 1, W * h) - piece.lo;
    auto add_part = [&](int64_t a, int64_t n, size_t p, bool whole) {
      Part part;
      part.lo = a, part.n = n, part.p = p, part.whole = whole;
      piece.parts.push_back(std::move(part));
    };
    each_piece_between(unit.offsets, piece.lo, piece.lo + piece.n, [&](size_t p, int64_t a, int64_t b) {
      add_part(a, b - a, p, a == unit.offsets[p] && b == unit.offsets[p + 1]);  // a part a parameter
    });
    unit.pieces.push_back(std::move(piece));
  }
  return unit;
}

void RankShards::place_state(const std::vector<std::string>& names, std::vector<std::vector<std::vector<float>>>& host) {
  for (const Unit& unit : units_)  // every size checked before anything is placed
    for (size_t p = 0; p < unit.params.size(); ++p)
      check_loaded_slots(names, host, unit.params[p], unit.offsets[p + 1] - unit.offsets[p]);
  for (Unit& unit : units_)
    for (size_t i = 0; i < unit.pieces.size(); ++i)
      for (Part& part : unit.pieces[i].parts) {
        part.state.assign(slots_, Tensor());
        for (size_t j = 0; j < slots_; ++j) {
          MemoryTagScope tag(MemoryTag::optimizer_state);  // zeros before the first step
          part.state[j] = Tensor::from_vector(from_host(unit, part, [&](size_t k) -> const std::vector<float>& { return host[k][j]; }),
                                              part_shape(unit, part), devices_[i]);
        }
      }
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
}

std::vector<float> RankShards::from_host(const Unit& unit, const Part& part,
                                        const std::function<const std::vector<float>&(size_t)>& full) const {
  std::vector<float> flat(static_cast<size_t>(part.n), 0.0f);
  each_piece_between(unit.offsets, part.lo, part.lo + part.n, [&](size_t p, int64_t a, int64_t b) {
    const std::vector<float>& from = full(unit.params[p]);
    if (!from.empty())
      std::copy(from.begin() + (a - unit.offsets[p]), from.begin() + (b - unit.offsets[p]), flat.begin() + (a - part.lo));
  });
  return flat;
}

Shape RankShards::part_shape(const Unit& unit, const Part& part) const {
  return part.whole ? replicas_[unit.params[part.p]][0].shape() : Shape{part.n};
}

Tensor RankShards::chunk_on_first(const Unit& unit, const std::function<const Tensor&(const Part&)>& field) const {
  if (unit.pieces.size() == 1 && unit.pieces[0].parts.size() == 1 && !unit.pieces[0].parts[0].whole)
    return field(unit.pieces[0].parts[0]);
  Tensor chunk = Tensor::empty({unit.n}, device());  // the parts end to end on the first device
  for (const Piece& piece : unit.pieces)
    for (const Part& part : piece.parts) copy_bytes(field(part), 0, chunk, float_bytes(part.lo - unit.lo), float_bytes(part.n));
  return chunk;
}

void RankShards::copy_flat(const Unit& unit, size_t i, int64_t lo, const Tensor& flat, bool into_replicas) const {
  each_piece_between(unit.offsets, lo, lo + flat.numel(), [&](size_t p, int64_t a, int64_t b) {
    const Tensor& w = replicas_[unit.params[p]][i];
    const size_t in_param = float_bytes(a - unit.offsets[p]), in_flat = float_bytes(a - lo), bytes = float_bytes(b - a);
    if (into_replicas) copy_bytes(flat, in_flat, w, in_param, bytes);
    else copy_bytes(w, in_param, flat, in_flat, bytes);
  });
}

std::vector<dist::Work> RankShards::all_gather_unit(const Unit& unit, const Tensor& chunk,
                                                    const std::vector<Tensor>& into) const {
  // Parameter by parameter straight into its tensor: every rank gives the part of it that lies in its
  // chunk (MPI_Allgatherv's counts), so no rank holds a second whole copy of the unit. One holder:
  // straight from the part; several: from the chunk, the parts end to end on the first device.
  std::vector<dist::Work> works;
  const int64_t P = unit.offsets.back();
  for (size_t p = 0; p < unit.params.size(); ++p) {
    const std::vector<int64_t> counts = dist::counts_in_chunks(P, unit.offsets[p], unit.offsets[p + 1], group_);
    if (chunk.defined()) {
      const int64_t in_chunk = std::clamp<int64_t>(unit.offsets[p] - unit.lo, 0, unit.n);
      works.push_back(dist::allgather_async(chunk, in_chunk, into[p], counts, group_));
      continue;
    }
    const Tensor* mine = &into[p];  // none of it in this rank's chunk: a count of 0
    for (const Part& part : unit.pieces[0].parts)
      if (part.p == p) mine = &part.param;
    works.push_back(dist::allgather_async(*mine, 0, into[p], counts, group_));
  }
  return works;
}

Step RankShards::clipped(const Step& step, GradClip* clip) const {
  // clip_grad_norm_: this rank's pieces' squares, added over the group (the same norm on every rank);
  // the pieces of a tp_group's slices apart, which apply() adds over that group too.
  if (!clip) return step;
  double split = 0, other = 0;
  for (const Unit& unit : units_)
    for (const Piece& piece : unit.pieces)
      for (const Part& part : piece.parts) {
        const std::vector<float> v = part.grad.to_vector();
        each_piece_between(unit.offsets, part.lo, part.lo + part.n, [&](size_t p, int64_t a, int64_t b) {
          double& sum = clip->is_split(unit.params[p]) ? split : other;
          for (int64_t e = a; e < b; ++e) sum += static_cast<double>(v[size_t(e - part.lo)]) * static_cast<double>(v[size_t(e - part.lo)]);
        });
      }
  const std::vector<double> both = dist::sum_over_ranks({split, other}, group_);
  return clip->apply(step, both[0], both[1]);
}

void RankShards::step(const StepInput& in, const Step& step, GradClip* clip) {
  NoGrad no_grad;
  if (stage_ < 3) {
    if (in.weights.empty()) return;
    sum_into_pieces(in);  // every part: its values (its replica itself where whole) and its summed gradient
  } else {
    if (!placed()) throw run_through_fsdp();
    shard(in.weights, in.names, {}, in.host);  // the pieces stay; a loaded state, if one waits, is placed
    for (size_t u = 0; u < units_.size(); ++u) {
      for (auto& work : units_[u].works) work.wait();  // a prefetch never used
      units_[u].gathering.clear(), units_[u].works.clear(), units_[u].sending = Tensor();
      for (size_t i = 0; i < devices_.size(); ++i) release_unit(u, i);
    }
    if (alone()) sum_alone();  // backward added the gradients in; zeros where none arrived
  }
  std::vector<ReplicaStep> mine;  // every part of every unit: its parameters, state and summed gradient
  for (const Unit& unit : units_)
    for (const Piece& piece : unit.pieces)
      for (const Part& p : piece.parts) mine.push_back({p.param, p.state, p.grad});
  if (replicated_over_ && replicated_over_->size() > 1)  // HYBRID_SHARD: every rank holds the same pieces
    for (const ReplicaStep& r : mine) dist::allreduce(r.g, *replicated_over_);
  const Step s = clipped(step, clip);  // every rank of the group finds the same found_inf: it sums their squares
  if (!(clip && clip->found_inf))  // a GradScaler's skipped step: the shards and replicas as they were
    update_my_shard_then_all_gather(mine, s);  // stage 3 gathers nothing: the next forward does
  if (stage_ == 3) {
    if (!alone())  // over ranks the sums are added into; a group of one keeps them until the next gradient
      for (const ReplicaStep& r : mine) fill_(r.g, 0.0f);
    ++steps_;
  } else {
    for (Piece& piece : units_[0].pieces)  // the step's copies and sums (stage 2 keeps its chunk's sum)
      for (Part& p : piece.parts) {
        p.param = Tensor();
        if (stage_ == 1 || !alone()) p.grad = Tensor();
      }
  }
}

void RankShards::all_gather() {
  if (stage_ == 3) return;  // stage 3 gathers a unit at its next forward (start_gather, gather)
  ++steps_;
  if (steps_ == 2 && !alone() && fails_in_allgather(stage_))  // a failure among ranks
    throw DeviceError("injected failure inside the ZeRO-" + std::to_string(stage_) + " all-gather of step 2 "
                      "(D2L_FAIL_RANK_IN_ALLGATHER=" + std::getenv("D2L_FAIL_RANK_IN_ALLGATHER") + ")");
  // Parameter by parameter and holder by holder: holder i's share of the parameter (its elements in
  // piece i of every rank) all-gathered over the group, each rank giving the part it updated (a whole
  // parameter's part is the replica itself: gathered in place), straight into the replica on device
  // i where that share is the whole parameter (one holder: always), else into a buffer; then copied
  // from device i into the replicas on the process's other devices.
  const Unit& unit = units_[0];
  struct Gathered {
    size_t k, i;
    Tensor into;
    std::vector<Segment> share;
    dist::Work work;
  };
  std::vector<Gathered> gathered;
  for (size_t p = 0; p < unit.params.size(); ++p)
    for (size_t i = 0; i < holders(); ++i) {
      Gathered g{unit.params[p], i, Tensor(), segments(i, unit.offsets[p], unit.offsets[p + 1]), {}};
      const int64_t n = total(g.share);
      if (n == 0) continue;  // the same on every rank: none of it is any rank's piece i
      const Tensor& replica = replicas_[g.k][i];
      const Segment& me = g.share[static_cast<size_t>(group_.rank())];
      const Tensor mine = me.n > 0 ? part_at(i, me.lo, me.n)->param : Tensor();
      // A group of one gathers nothing: the updated part is the share.
      g.into = n == replica.numel() ? replica : alone() ? mine : Tensor::empty({n}, devices_[i]);
      g.work = dist::allgather_async(mine.defined() ? mine : g.into, 0, g.into, counts(g.share), group_);  // a count of 0
      gathered.push_back(std::move(g));
    }
  for (Gathered& g : gathered) {
    g.work.wait();
    for (size_t j = 0; j < devices_.size(); ++j) {
      const Tensor& to = replicas_[g.k][j];
      if (to.impl().storage == g.into.impl().storage) continue;  // gathered in place
      for (const Segment& seg : g.share)
        if (seg.n > 0) copy_bytes(g.into, float_bytes(seg.at), to, float_bytes(seg.lo - offsets()[g.k]), float_bytes(seg.n));
    }
  }
}

std::vector<std::vector<std::vector<float>>> RankShards::gather_state() const {
  if (!placed()) return {};
  std::vector<std::vector<std::vector<float>>> out(replicas_.size(), std::vector<std::vector<float>>(slots_));
  for (const Unit& unit : units_)
    for (size_t j = 0; j < slots_; ++j) {
      const Tensor whole = Tensor::empty({unit.offsets.back()}, device());
      dist::allgather(chunk_on_first(unit, [j](const Part& p) -> const Tensor& { return p.state[j]; }), whole, group_);
      const std::vector<float> v = whole.to_vector();
      for (size_t p = 0; p < unit.params.size(); ++p)
        out[unit.params[p]][j].assign(v.begin() + unit.offsets[p], v.begin() + unit.offsets[p + 1]);
    }
  return out;
}

void RankShards::add_memory(const std::function<DeviceMemory&(Device)>& at) const {
  if (!placed()) return;
  for (const Unit& unit : units_)
    for (size_t i = 0; i < unit.pieces.size(); ++i)
      for (const Part& p : unit.pieces[i].parts) {
        DeviceMemory& m = at(devices_[i]);
        // Stages 1 and 2: a whole part's values are the replica's, counted already; stage 3 releases the replicas.
        m.parameter_bytes += p.whole && stage_ < 3 ? 0 : bytes_held(p.param);
        m.summed_gradient_bytes += bytes_held(p.grad);
        for (const Tensor& t : p.state) m.state_bytes += bytes_held(t);
      }
  for (size_t i = 0; i < sums_.size(); ++i) at(devices_[i]).summed_gradient_bytes += bytes_held(sums_[i]);
  for (size_t i = 0; i < holders() && stage_ < 3; ++i) at(devices_[i]).summed_gradient_bytes += received_bytes(i);
}

int64_t RankShards::received_bytes(size_t i) const {
  int64_t n = 0;  // the sums received into buffers on holder i's device, not yet in their parts
  for (const Receipt& r : receipts_)
    if (r.i == i && !r.direct && r.n > 0) n += bytes_held(r.recv);  // undefined once taken
  return n;
}

int64_t RankShards::chunk() const {
  int64_t n = 0;
  for (const Unit& unit : units_) n += unit.n;
  return n;
}

int64_t RankShards::parameter_bytes() const {
  int64_t n = 0;
  for (const Unit& unit : units_)
    for (const Piece& piece : unit.pieces)
      for (const Part& p : piece.parts) n += p.whole && stage_ < 3 ? 0 : bytes_held(p.param);
  return n;
}

int64_t RankShards::gradient_bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < holders() && stage_ < 3; ++i) n += received_bytes(i);
  for (const Tensor& t : sums_) n += bytes_held(t);
  for (const Unit& unit : units_)
    for (const Piece& piece : unit.pieces)
      for (const Part& p : piece.parts) n += bytes_held(p.grad);
  return n;
}

int64_t RankShards::state_bytes() const {
  int64_t n = 0;
  for (const Unit& unit : units_)
    for (const Piece& piece : unit.pieces)
      for (const Part& p : piece.parts)
        for (const Tensor& t : p.state) n += bytes_held(t);
  return n;
}

std::vector<int64_t> RankShards::unit_sizes() const {
  std::vector<int64_t> out;
  for (const Unit& unit : units_) out.push_back(unit.offsets.back());
  return out;
}

// ---- Stages 1 and 2: the chunk laid out, the gradients reduce-scattered into it ----

ShardLayout RankShards::layout() const {
  if (stage_ == 3 || !placed()) return {};
  ShardLayout l{units_[0].offsets, {}};
  for (int r = 0; r <= group_.size(); ++r) l.bounds.push_back(dist::chunk_begin(l.total(), r, group_));
  return l;
}

bool RankShards::fits(const std::vector<std::vector<Tensor>>& weights) const {
  // The replicas laid out (place, shard) against these: the same sizes on the same devices.
  if (!placed() || weights.size() != replicas_.size()) return false;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (weights[k].size() != devices_.size() || weights[k][0].numel() != replicas_[k][0].numel()) return false;
    for (size_t i = 0; i < weights[k].size(); ++i)
      if (weights[k][i].device() != devices_[i]) return false;
  }
  return true;
}

void RankShards::place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                       std::vector<std::vector<std::vector<float>>>& host) {
  const std::vector<Device> devices = devices_of(weights, names);
  // The unsharded values: loaded ones, else the chunk kept so far (the parameters moved), else zeros.
  if (!loaded_state_waits(host) && placed()) host = gather_state();
  std::vector<int64_t> offsets{0};
  for (size_t k = 0; k < weights.size(); ++k) {
    offsets.push_back(offsets.back() + weights[k][0].numel());
    check_loaded_slots(names, host, k, weights[k][0].numel());  // before anything changes
  }
  // A loaded state for the same parameters keeps the buckets, and what backward already sent into them.
  const bool same_layout = placed() && offsets == this->offsets() && devices_ == devices;
  if (!same_layout && (!receipts_.empty() || std::find(packed_.begin(), packed_.end(), true) != packed_.end()))
    throw ConfigError("Trainer: zero_stage " + std::to_string(stage_) + ": the parameters changed between backward and "
                      "the step, whose gradients are already reduce-scattered and released: step before moving them");
  // A group of one adds the gradients into the parts during backward: the sums made so far for the
  // old layout (a replica kept across reset_ctx reported its gradient there) move to the new one.
  std::vector<float> carried;
  if (!same_layout && alone() && received_) carried = flat_sums();
  devices_ = devices, replicas_ = weights;
  if (!same_layout) {
    std::vector<size_t> all(weights.size());
    std::iota(all.begin(), all.end(), size_t{0});
    units_.assign(1, unit_of(all));
    make_buckets();
    MemoryTagScope tag(MemoryTag::summed_gradients);  // stage 2's sums, which backward sends into: 4 Psi_r in all
    sums_.clear();
    if (stage_ == 2 && !alone())
      for (size_t i = 0; i < units_[0].pieces.size(); ++i) sums_.push_back(Tensor::empty({units_[0].pieces[i].n}, devices_[i]));
    for (size_t i = 0; i < units_[0].pieces.size() && !carried.empty(); ++i)
      for (Part& part : units_[0].pieces[i].parts)
        part.grad = Tensor::from_vector(std::vector<float>(carried.begin() + part.lo, carried.begin() + part.lo + part.n),
                                        part_shape(units_[0], part), devices_[i]);
  }
  place_state(names, host);
  where_.clear();
  for (size_t k = 0; k < weights.size(); ++k) where_.emplace_back(0, k);
  index_.clear();
  completed_.assign(weights.size(), 0);
  for (size_t k = 0; k < weights.size(); ++k)
    for (size_t i = 0; i < weights[k].size(); ++i) index_[&weights[k][i].impl()] = {k, i};
}

void RankShards::make_buckets() {
  // From the last parameter back, each bucket closing once it holds bucket_mb_ MiB (DDP's rule). At
  // stage 1 every .grad buffer stays anyway: each is sent as it is, one parameter a bucket, no packing.
  const size_t params = offsets().size() - 1;
  const double cap = stage_ == 1 ? 0.0 : bucket_mb_ * 1024 * 1024;
  buckets_.clear();
  bucket_of_.assign(params, 0);
  packed_.assign(params, false);
  for (size_t last = params; last > 0;) {
    Bucket b;
    b.first = b.last = last;
    b.packed.resize(holders());
    double bytes = 0;
    do {
      --b.first;
      bytes += static_cast<double>(float_bytes(offsets()[b.first + 1] - offsets()[b.first]));
    } while (b.first > 0 && bytes < cap);
    for (size_t k = b.first; k < b.last; ++k) bucket_of_[k] = buckets_.size();
    buckets_.push_back(b);
    last = b.first;
  }
}

std::vector<int64_t> RankShards::counts(const std::vector<Segment>& share) {
  std::vector<int64_t> out;
  for (const Segment& seg : share) out.push_back(seg.n);
  return out;
}

std::vector<RankShards::Segment> RankShards::segments(size_t i, int64_t a, int64_t b) const {
  const int64_t P = offsets().back(), h = static_cast<int64_t>(holders()), W = group_.size();
  std::vector<Segment> out;
  int64_t at = 0;
  for (int64_t r = 0; r < W; ++r) {  // rank r's piece i: shard r h + i of W h (unit_of)
    const int64_t lo = std::max(a, chunk_begin(P, r * h + static_cast<int64_t>(i), W * h));
    const int64_t hi = std::min(b, chunk_begin(P, r * h + static_cast<int64_t>(i) + 1, W * h));
    out.push_back({lo, std::max<int64_t>(hi - lo, 0), at});
    at += out.back().n;
  }
  return out;
}

Tensor RankShards::device_sum(size_t k) const {
  const std::vector<Tensor>& on = replicas_[k];
  const Tensor& first = on[0];
  // Added into the first device's .grad buffer in place, as the 'device' kvstore sums: the step (or,
  // at stage 2, the release after packing) is done with its contents, and a copy would hold 4 Psi more.
  Tensor sum = first.grad().defined() ? first.grad() : Tensor::zeros(first.shape(), device());
  for (size_t i = 1; i < on.size(); ++i)  // device order, as the 'device' kvstore adds
    if (on[i].grad().defined()) add_(sum, on[i].grad().to(device()));
  return sum;
}

Tensor RankShards::device_sum(size_t k, int64_t lo, int64_t n, Device d) const {
  // The same additions in the same order as above, on the elements device d sums: the same bits.
  Tensor sum = Tensor::zeros({n}, d);
  for (size_t j = 0; j < replicas_[k].size(); ++j) {
    const Tensor& g = replicas_[k][j].grad();
    if (!g.defined()) continue;
    if (j == 0) {
      copy_bytes(g, float_bytes(lo), sum, 0, float_bytes(n));
      continue;
    }
    if (g.device() == d && lo == 0 && n == g.numel()) {  // device d's own whole gradient: added as it is
      add_(sum, reshape(g, {n}));
      continue;
    }
    Tensor from = Tensor::empty({n}, d);
    copy_bytes(g, float_bytes(lo), from, 0, float_bytes(n));
    add_(sum, from);
  }
  return sum;
}

void RankShards::pack(size_t k, bool release) {
  // Parameter k's gradient, summed over this rank's devices (zeros if it has none), into its place in
  // the bucket: with one holder on the first device (a lone parameter's sum is the bucket); with a
  // holder a device, each device i sums the elements of it that lie in piece i of any rank (the
  // devices' reduce-scatter, before the ranks'). At stage 2 the .grad buffers go then (the allocator
  // takes each back once the queued copies have read it).
  Bucket& b = buckets_[bucket_of_[k]];
  const int64_t a = offsets()[b.first], end = offsets()[b.last];
  if (holders() == 1) {
    const Tensor g = device_sum(k);
    Tensor& packed = b.packed[0];
    const int64_t at = offsets()[k] - a;
    if (b.last - b.first == 1) {
      if (packed_[k]) add_(packed, g);
      else packed = g;
    } else {
      if (!packed.defined()) packed = Tensor::empty({end - a}, device());
      if (packed_[k]) add_at(packed, at, g);
      else copy_bytes(g, 0, packed, float_bytes(at), float_bytes(g.numel()));
    }
  } else {
    for (size_t i = 0; i < holders(); ++i) {
      const std::vector<Segment> share = segments(i, a, end);
      Tensor& packed = b.packed[i];
      for (const Segment& seg : share) {
        const int64_t lo = std::max(seg.lo, offsets()[k]), hi = std::min(seg.lo + seg.n, offsets()[k + 1]);
        if (lo >= hi) continue;
        if (!packed.defined()) packed = Tensor::empty({total(share)}, devices_[i]);
        const Tensor sum = device_sum(k, lo - offsets()[k], hi - lo, devices_[i]);
        if (packed_[k]) add_at(packed, seg.at + lo - seg.lo, sum);
        else copy_bytes(sum, 0, packed, float_bytes(seg.at + lo - seg.lo), float_bytes(hi - lo));
      }
    }
  }
  if (release)
    for (auto& w : replicas_[k]) w.impl().grad.reset();
  if (!packed_[k]) packed_[k] = true, ++b.arrived;
  if (b.arrived == b.last - b.first) send(b);
}

void RankShards::send(Bucket& b) {
  // The bucket is elements [a, end) of the flat vector. Holder by holder, its share (above) is
  // reduce-scattered over the group: rank r receives the part in its piece i, straight into piece
  // i's sum at stage 2, into the part that holds it at stage 1 (a bucket is one parameter there, and
  // that part is one part). A bucket sent again in a step (gradient accumulation) is received apart
  // and added in (take).
  const Unit& unit = units_[0];
  const int64_t a = offsets()[b.first], end = offsets()[b.last];
  for (size_t i = 0; i < holders(); ++i) {
    const std::vector<Segment> share = segments(i, a, end);
    if (total(share) == 0) continue;  // the same on every rank
    const Segment& me = share[static_cast<size_t>(group_.rank())];
    Receipt r;
    r.i = i, r.at = me.n > 0 ? me.lo : unit.pieces[i].lo, r.n = me.n, r.add = b.sent > 0;
    Part* only = r.add || r.n == 0 || stage_ == 2 ? nullptr : part_at(i, r.at, r.n);
    r.direct = (stage_ == 2 && !r.add) || only;
    int64_t into = 0;
    if (r.direct && stage_ == 2) {
      r.recv = sums_[i], into = r.at - unit.pieces[i].lo;
    } else if (r.direct) {
      r.recv = sum_of(*only, devices_[i]);
    } else {
      MemoryTagScope tag(MemoryTag::summed_gradients);
      r.recv = Tensor::empty({std::max<int64_t>(r.n, 1)}, devices_[i]);
    }
    r.work = dist::reduce_scatter_async(b.packed[i], r.recv, into, counts(share), group_);
    receipts_.push_back(r);
    if ((stage_ == 2 || holders() > 1) && r.work.pending) {  // the rate limiter (above): a packed share is a copy
      in_flight_.push_back(r.work.done);
      while (in_flight_.size() > kInFlight * holders()) {
        in_flight_.front().synchronize();
        in_flight_.pop_front();
      }
    }
  }
  if (stage_ == 2)  // the receipts the limiter has waited for go into their pieces now, and their buffers
    for (size_t j = 0; j + kInFlight * holders() < receipts_.size(); ++j) take(receipts_[j]);
  for (Tensor& t : b.packed) t = Tensor();  // the communication thread holds them until the reduce-scatter has read them
  for (size_t k = b.first; k < b.last; ++k) packed_[k] = false;
  b.arrived = 0;
  ++b.sent;
}

Tensor RankShards::sum_of(Part& part, Device d) {
  if (!part.grad.defined()) {
    MemoryTagScope tag(MemoryTag::summed_gradients);
    part.grad = Tensor::empty(part_shape(units_[0], part), d);
  }
  return part.grad;
}

RankShards::Part* RankShards::part_at(size_t i, int64_t at, int64_t n) {
  for (Part& part : units_[0].pieces[i].parts)
    if (part.lo == at && part.n == n) return &part;
  return nullptr;
}

void RankShards::take(Receipt& r) {
  if (r.taken) return;
  r.work.wait();
  r.taken = true;
  if (r.direct || r.n == 0) return;
  const Piece& piece = units_[0].pieces[r.i];
  const Device d = devices_[r.i];
  if (stage_ == 2) {  // into piece i's sum
    if (r.add) add_at(sums_[r.i], r.at - piece.lo, r.recv);
    else copy_bytes(r.recv, 0, sums_[r.i], float_bytes(r.at - piece.lo), float_bytes(r.n));
  } else {  // into the part it is
    Part* part = part_at(r.i, r.at, r.n);
    if (r.add) {
      Tensor late = Tensor::empty(part->grad.shape(), d);
      copy_bytes(r.recv, 0, late, 0, float_bytes(r.n));
      add_(part->grad, late);
    } else {
      copy_bytes(r.recv, 0, sum_of(*part, d), 0, float_bytes(r.n));
    }
  }
  r.recv = Tensor();
}

void RankShards::reduce_scatter_rest(bool release) {
  // The buckets backward has not sent (every one at stage 1, and at the first step), in bucket
  // order: the gradients not packed yet are taken from the .grad buffers, zeros where there are none.
  for (Bucket& b : buckets_) {
    if (b.sent > 0 && b.arrived == 0) continue;  // sent, and nothing added since
    std::vector<size_t> missing;
    for (size_t k = b.first; k < b.last; ++k)
      if (!packed_[k]) missing.push_back(k);
    for (size_t k : missing) pack(k, release);  // the last one sends the bucket
  }
}

void RankShards::wait_for_sums() {
  for (Receipt& r : receipts_) take(r);
  receipts_.clear(), in_flight_.clear();
  for (Bucket& b : buckets_) b.sent = 0;
  std::fill(completed_.begin(), completed_.end(), 0);
}

void RankShards::sum_into_pieces(const StepInput& in) {
  const bool summed = in.kv.reduce_all(in.weights);  // DDP's buckets: every gradient summed already
  if (loaded_state_waits(in.host) || !fits(in.weights)) place(in.weights, in.names, in.host);  // checks the devices before any collective
  replicas_ = in.weights;
  if (stage_ == 2 && summed)
    throw ConfigError("Trainer: zero_stage 2 reduce-scatters the gradients, but the gradient buckets already all-reduced "
                      "them: use zero_stage 1 with buckets");
  // A group of one sums straight into the parts, first: its temporaries go before the parts' copies come.
  if (alone() && !summed) sum_alone();
  Unit& unit = units_[0];
  for (size_t i = 0; i < unit.pieces.size(); ++i)
    for (Part& part : unit.pieces[i].parts) {
      const Tensor& w = replicas_[unit.params[part.p]][i];
      const size_t at = float_bytes(part.lo - unit.offsets[part.p]), bytes = float_bytes(part.n);
      // Its values: the replica itself where the part is the whole parameter, else a copy of the part.
      if (part.whole) {
        part.param = w;
      } else {
        part.param = Tensor::empty({part.n}, devices_[i]);
        copy_bytes(w, at, part.param, 0, bytes);
      }
      if (stage_ == 2) continue;  // the chunk's sum, below
      // Stage 1: DDP's buckets all-reduced every gradient during backward: the part of the sum (the
      // .grad buffer itself where whole; zeros where a parameter got no gradient); else the
      // reduce-scatter's, below.
      const Tensor& g = replicas_[unit.params[part.p]][0].grad();
      MemoryTagScope tag(MemoryTag::summed_gradients);
      if (summed && part.whole && i == 0 && g.defined()) {
        part.grad = g;
      } else if (summed) {
        part.grad = Tensor::zeros(part_shape(unit, part), devices_[i]);
        if (g.defined()) copy_bytes(g, at, part.grad, 0, bytes);
      }
    }
  if (summed || alone()) return;
  // The sum arrives in the parts at stage 1, which reduce-scatters every bucket now and keeps the
  // .grad buffers; at stage 2 in each piece's sum, where backward sent most of it and released the
  // gradients, and each part takes a copy of its range of it (of its own shape).
  reduce_scatter_rest(stage_ == 2);
  wait_for_sums();
  if (stage_ == 2)
    for (size_t i = 0; i < unit.pieces.size(); ++i)
      for (Part& part : unit.pieces[i].parts) {
        part.grad = Tensor::empty(part_shape(unit, part), devices_[i]);
        copy_bytes(sums_[i], float_bytes(part.lo - unit.pieces[i].lo), part.grad, 0, float_bytes(part.n));
      }
}

void RankShards::add_contribution(size_t k, size_t j) {
  // Device j's gradient of parameter k, complete: each piece's elements of it added into that
  // piece's part, on the piece's device. Contributions arrive in device order (backward runs device
  // after device), so each sum is g0 + g1 + ... as the 'device' kvstore adds. A device's own whole
  // parameter takes its .grad buffer over as the sum: no copy, so at N = 1 stage 2 holds what
  // replication holds.
  const Tensor g = replicas_[k][j].grad();
  if (!g.defined()) return;
  if (stale_) {  // the first gradient since the last step: the last step's sums go
    for (Unit& unit : units_)
      for (Piece& piece : unit.pieces)
        for (Part& part : piece.parts) part.grad = Tensor();
    stale_ = false;
  }
  received_ = true;
  const auto [u, p] = where_[k];
  Unit& unit = units_[u];
  MemoryTagScope tag(MemoryTag::summed_gradients);
  for (size_t i = 0; i < unit.pieces.size(); ++i)
    for (Part& part : unit.pieces[i].parts) {
      if (part.p != p) continue;
      const bool own = part.whole && i == j;
      if (own && !part.grad.defined()) {
        part.grad = g;
        runtime(devices_[i]).allocator->retag(g.impl().storage->ptr, MemoryTag::summed_gradients);
        continue;
      }
      Tensor add = g;
      if (!own) {
        add = Tensor::empty(part_shape(unit, part), devices_[i]);
        copy_bytes(g, float_bytes(part.lo - unit.offsets[p]), add, 0, float_bytes(part.n));
      }
      if (part.grad.defined()) add_(part.grad, add);
      else part.grad = add;
    }
  replicas_[k][j].impl().grad.reset();
}

void RankShards::sum_alone() {
  // A group of one: the reduce-scatter over the ranks is the identity, and each part's sum is made
  // from the devices' gradients directly. Stages 2 and 3: backward added them in (add_contribution);
  // what it did not (stage 2's first step, made before the layout) is added now, and a part no
  // gradient reached is zeros; the sums stay for reading until the next gradient arrives.
  MemoryTagScope tag(MemoryTag::summed_gradients);
  if (stage_ >= 2) {
    for (size_t k = 0; k < replicas_.size(); ++k)
      for (size_t j = 0; j < devices_.size(); ++j) add_contribution(k, j);  // none left at stage 3
    for (Unit& unit : units_)
      for (size_t i = 0; i < unit.pieces.size(); ++i)
        for (Part& part : unit.pieces[i].parts)
          if (!part.grad.defined() || stale_) part.grad = Tensor::zeros(part_shape(unit, part), devices_[i]);
    stale_ = true, received_ = false;
    return;
  }
  Unit& unit = units_[0];
  // Stage 1: device i adds up its piece's elements of every device's .grad buffer, in device order;
  // a whole parameter of the first device's piece in that device's .grad buffer itself.
  for (size_t i = 0; i < unit.pieces.size(); ++i)
    for (Part& part : unit.pieces[i].parts)
      part.grad = part.whole && i == 0
                      ? device_sum(part.p)
                      : reshape(device_sum(part.p, part.lo - unit.offsets[part.p], part.n, devices_[i]), part_shape(unit, part));
}

std::vector<float> RankShards::flat_sums() const {
  std::vector<float> out;
  for (size_t i = 0; i < units_[0].pieces.size(); ++i) {
    const std::vector<float> v = gradient_piece(i);
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

std::vector<float> RankShards::gradient_piece(size_t i) const {
  if (i < sums_.size()) return sums_[i].to_vector();
  const Piece& piece = units_[0].pieces[i];
  std::vector<float> out(static_cast<size_t>(piece.n), 0.0f);
  for (const Part& part : piece.parts)
    if (part.grad.defined()) {
      const std::vector<float> v = part.grad.to_vector();
      std::copy(v.begin(), v.end(), out.begin() + (part.lo - piece.lo));
    }
  return out;
}

std::vector<std::vector<float>> RankShards::chunk_state() const {
  std::vector<std::vector<float>> out;
  if (!placed() || stage_ == 3) return out;
  for (size_t j = 0; j < slots_; ++j)
    out.push_back(units_[0].n > 0 ? chunk_on_first(units_[0], [j](const Part& p) -> const Tensor& { return p.state[j]; }).to_vector()
                                  : std::vector<float>{});
  return out;
}

std::vector<std::pair<size_t, size_t>> RankShards::buckets() const {
  std::vector<std::pair<size_t, size_t>> out;
  for (const Bucket& b : buckets_) out.emplace_back(b.first, b.last);
  return out;
}

}  // namespace d2l::optim::zero
