#include "core/optim/fsdp_dist.hpp"

#include <algorithm>
#include <cstdlib>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "core/optim/zero_dist.hpp"

namespace d2l::optim::zero {

namespace {

constexpr size_t kBytesPerFloat = sizeof(float);

// Calls f(i, a, b) for every parameter i of the unit (its place in the unit) with elements in the
// unit's flat range [lo, hi): [a, b) those elements, in the unit's flat numbering.
template <class F>
void each_unit_piece(const std::vector<int64_t>& offsets, int64_t lo, int64_t hi, F f) {
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const int64_t a = std::max(lo, offsets[i]), b = std::min(hi, offsets[i + 1]);
    if (a < b) f(i, a, b);
  }
}

// Per rank of the group, how many of parameter i's elements lie in that rank's chunk of the unit's
// flat vector (P_u elements, the one split rule): the counts of its all-gather and reduce-scatter.
std::vector<int64_t> counts_of(const std::vector<int64_t>& offsets, size_t i, const dist::Group& group) {
  const int64_t P = offsets.back();
  std::vector<int64_t> counts;
  for (int r = 0; r < group.size(); ++r)
    counts.push_back(std::max<int64_t>(0, std::min(offsets[i + 1], dist::chunk_begin(P, r + 1, group)) -
                                              std::max(offsets[i], dist::chunk_begin(P, r, group))));
  return counts;
}

}  // namespace

void RankParameterShards::shard(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                                const std::vector<std::vector<size_t>>& units,
                                std::vector<std::vector<std::vector<float>>>& host) {
  if (placed()) {  // the chunks stay; a loaded state, if one waits, replaces the state
    if (loaded_state_waits(host)) place_state(names, host);
    return;
  }
  // Every chunk on this process's first device (the paper's setting: its one device); its other
  // devices hold replicas of the units while they run.
  std::vector<Device> devices;
  if (!weights.empty())
    for (auto& w : weights[0]) devices.push_back(w.device());
  for (size_t k = 0; k < weights.size(); ++k) {
    std::vector<Device> on;
    for (auto& w : weights[k]) on.push_back(w.device());
    if (on != devices)
      throw ConfigError("Trainer: zero_stage 3 needs every trainable parameter on the same devices, in the same order: '" +
                        names[0] + "' is on " + str(devices) + ", '" + names[k] + "' on " + str(on) + " in rank " +
                        std::to_string(dist::rank()));
  }
  devices_ = devices.empty() ? std::vector<Device>{cpu(0)} : devices;
  replicas_ = weights;
  const int r = group_.rank();
  std::vector<Unit> laid;
  for (const auto& params : units) {
    Unit unit;
    unit.params = params;
    unit.offsets.push_back(0);
    for (size_t k : params) unit.offsets.push_back(unit.offsets.back() + replicas_[k][0].numel());
    const int64_t P = unit.offsets.back(), h = static_cast<int64_t>(holders()), W = group_.size();
    unit.lo = dist::chunk_begin(P, r, group_);
    unit.n = dist::chunk_begin(P, r + 1, group_) - unit.lo;
    // Holder i's piece: shard r h + i of W h (the one split rule nests: the pieces are the chunk).
    // This rank's replicas hold the same values as every other rank's: a piece is a local copy.
    for (int64_t i = 0; i < h; ++i) {
      Piece piece;
      piece.lo = chunk_begin(P, r * h + i, W * h);
      piece.n = chunk_begin(P, r * h + i + 1, W * h) - piece.lo;
      const Device d = devices_[static_cast<size_t>(i)];
      {
        MemoryTagScope tag(MemoryTag::parameters);
        piece.param = Tensor::empty({piece.n}, d);
      }
      each_unit_piece(unit.offsets, piece.lo, piece.lo + piece.n, [&](size_t j, int64_t a, int64_t b) {
        copy_bytes(replicas_[params[j]][static_cast<size_t>(i)], static_cast<size_t>(a - unit.offsets[j]) * kBytesPerFloat,
                   piece.param, static_cast<size_t>(a - piece.lo) * kBytesPerFloat, static_cast<size_t>(b - a) * kBytesPerFloat);
      });
      {
        MemoryTagScope tag(MemoryTag::summed_gradients);
        piece.grad = Tensor::zeros({piece.n}, d);
      }
      unit.pieces.push_back(std::move(piece));
    }
    laid.push_back(std::move(unit));
  }
  units_ = std::move(laid);
  place_state(names, host);
  for (size_t u = 0; u < units_.size(); ++u)
    for (size_t i = 0; i < devices_.size(); ++i) release_unit(u, i);
}

void RankParameterShards::gather_unit(size_t u, size_t i) {
  if (i == 0) return gather(u);
  const Unit& unit = units_[u];
  if (unit.params.empty() || gathered(unit.params[0], i)) return;
  // Device i's replicas are copies of the first device's: gathered there (a collective) when they
  // are not whole already, and released again once copied (backward reaches device i's units after
  // the first device has released them: memory stays one or two units a device).
  const bool borrowed = !gathered(unit.params[0], 0);
  gather(u);
  MemoryTagScope tag(MemoryTag::gathered);
  for (size_t k : unit.params) replicas_[k][i].impl().storage = replicas_[k][0].to(devices_[i]).storage();
  if (borrowed) release_unit(u, 0);
}


void RankParameterShards::unit_gradients_done(size_t u, size_t i) {
  // Each device's gradients reduce-scattered as they complete, added into the chunk's summed
  // gradient as a second backward pass's would be (device i's copied to the first device first).
  if (i > 0)
    for (size_t k : units_[u].params) {
      TensorImpl& t = replicas_[k][i].impl();
      if (t.grad) replicas_[k][0].impl().grad = Tensor(t.grad).to(device()).ptr();
      t.grad.reset();
    }
  reduce_scatter_gradients(u);
}

void RankParameterShards::place_state(const std::vector<std::string>& names,
                                      std::vector<std::vector<std::vector<float>>>& host) {
  for (Unit& unit : units_) {
    for (size_t i = 0; i < unit.params.size(); ++i)
      for (auto& slot : host[unit.params[i]])
        if (!slot.empty() && static_cast<int64_t>(slot.size()) != unit.offsets[i + 1] - unit.offsets[i])
          throw ShapeError("Trainer: a slot of the optimizer state of '" + names[unit.params[i]] + "' has " +
                           std::to_string(slot.size()) + " values but the parameter has " +
                           std::to_string(unit.offsets[i + 1] - unit.offsets[i]));
    for (Piece& piece : unit.pieces) {
      piece.state.assign(slots_, Tensor());
      for (size_t j = 0; j < slots_; ++j) {
        std::vector<float> flat(static_cast<size_t>(piece.n), 0.0f);  // zeros before the first step
        each_unit_piece(unit.offsets, piece.lo, piece.lo + piece.n, [&](size_t i, int64_t a, int64_t b) {
          const auto& from = host[unit.params[i]][j];
          if (!from.empty())
            std::copy(from.begin() + (a - unit.offsets[i]), from.begin() + (b - unit.offsets[i]), flat.begin() + (a - piece.lo));
        });
        MemoryTagScope tag(MemoryTag::optimizer_state);
        piece.state[j] = Tensor::from_vector(flat, {piece.n}, piece.param.device());
      }
    }
  }
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
}

void RankParameterShards::start_gather(size_t u) {
  Unit& unit = units_[u];
  if (!unit.gathering.empty() || (!unit.params.empty() && gathered(unit.params[0], 0))) return;
  if (steps_ == 1 && fails_in_allgather(3))
    throw DeviceError("injected failure inside the ZeRO-3 all-gather of step 2 (D2L_FAIL_RANK_IN_ALLGATHER=" +
                      std::string(std::getenv("D2L_FAIL_RANK_IN_ALLGATHER")) + ")");
  // The rate limiter: the device past the release of the unit two releases back before more memory is taken.
  while (released_.size() >= 2) {
    released_.front().synchronize();
    released_.pop_front();
  }
  // All-gather, parameter by parameter: every rank gives the part of it that lies in its chunk, and
  // the result lands in the buffer that becomes the replica, so no second copy of the unit is made.
  unit.sending = chunk_on_first(unit, [](const Piece& p) -> const Tensor& { return p.param; });
  MemoryTagScope tag(MemoryTag::gathered);
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const Tensor& w = replicas_[unit.params[i]][0];
    unit.gathering.push_back(Tensor::empty(w.shape(), device()));
    const int64_t in_chunk = std::clamp<int64_t>(unit.offsets[i] - unit.lo, 0, unit.n);
    unit.works.push_back(dist::allgather_async(unit.sending, in_chunk, unit.gathering.back(), counts_of(unit.offsets, i, group_), group_));
  }
}

void RankParameterShards::gather(size_t u) {
  Unit& unit = units_[u];
  if (!unit.params.empty() && gathered(unit.params[0], 0)) return;
  start_gather(u);
  for (auto& work : unit.works) work.wait();  // this device's compute stream waits for them here, not before
  for (size_t i = 0; i < unit.params.size(); ++i) replicas_[unit.params[i]][0].impl().storage = unit.gathering[i].storage();
  unit.gathering.clear(), unit.works.clear(), unit.sending = Tensor();
}

void RankParameterShards::release_unit(size_t u, size_t i) {
  if (units_[u].params.empty() || !gathered(units_[u].params[0], i)) return;
  if (i == 0) {  // the first device's release is what the rate limiter waits for
    Event e;
    runtime(device()).compute.record(e);
    released_.push_back(e);
  }
  for (size_t k : units_[u].params) {
    TensorImpl& t = replicas_[k][i].impl();
    t.storage.reset();
    t.grad.reset();
  }
}

void RankParameterShards::reduce_scatter_gradients(size_t u) {
  Unit& unit = units_[u];
  NoGrad no_grad;
  // Each gradient reduce-scattered from its .grad buffer (zeros for a parameter that got none): rank
  // r receives the sum over the ranks of the part of it that lies in its chunk, at that part's place.
  const Tensor mine = Tensor::empty({unit.n}, device());
  std::vector<dist::Work> works;
  for (size_t i = 0; i < unit.params.size(); ++i) {
    const Tensor& w = replicas_[unit.params[i]][0];
    const Tensor g = w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), device());
    const int64_t at = std::clamp<int64_t>(unit.offsets[i] - unit.lo, 0, unit.n);
    works.push_back(dist::reduce_scatter_async(g, mine, at, counts_of(unit.offsets, i, group_), group_));
    replicas_[unit.params[i]][0].impl().grad.reset();  // the communication thread holds it until it is read
  }
  for (auto& work : works) work.wait();
  // Accumulated: several backward passes before a step add up. Each holder's part of the chunk's sum
  // into its piece (one holder: the whole chunk, in place).
  if (unit.pieces.size() == 1 && unit.n > 0) add_(unit.pieces[0].grad, mine);
  for (size_t i = 0; unit.pieces.size() > 1 && i < unit.pieces.size(); ++i) {
    const Piece& p = unit.pieces[i];
    if (p.n == 0) continue;
    Tensor part = Tensor::empty({p.n}, p.grad.device());
    copy_bytes(mine, static_cast<size_t>(p.lo - unit.lo) * kBytesPerFloat, part, 0, static_cast<size_t>(p.n) * kBytesPerFloat);
    add_(p.grad, part);
  }
}

void RankParameterShards::step(const StepInput& in, const Step& step, GradClip* clip) {
  if (!placed()) throw run_through_fsdp();
  NoGrad no_grad;
  shard(in.weights, in.names, {}, in.host);  // the chunks stay; a loaded state, if one waits, is placed
  Step s = step;
  if (clip) {  // clip_grad_norm_: every unit's chunk's squares, added over the ranks
    double squares = 0;
    for (const Unit& unit : units_)
      for (const Piece& p : unit.pieces) squares += p.n > 0 ? sum_of_squares(p.grad) : 0.0;
    s = clip->apply(step, dist::sum_over_ranks({squares}, group_)[0]);
  }
  std::vector<ReplicaStep> mine;  // every unit's chunk: its parameters, state and summed gradient
  for (size_t u = 0; u < units_.size(); ++u) {
    Unit& unit = units_[u];
    for (auto& work : unit.works) work.wait();  // a prefetch never used
    unit.gathering.clear(), unit.works.clear(), unit.sending = Tensor();
    release_unit(u, 0);
    for (const Piece& p : unit.pieces)
      if (p.n > 0) mine.push_back({p.param, p.state, p.grad});
  }
  update_my_shard_then_all_gather(mine, s);  // stage 3: the chunks in place; the next forward gathers
  for (const ReplicaStep& r : mine) fill_(r.g, 0.0f);
  ++steps_;
}

std::vector<std::vector<float>> RankParameterShards::parameters() const {
  std::vector<std::vector<float>> out(replicas_.size());
  for (const Unit& unit : units_) {
    const Tensor whole = Tensor::empty({unit.offsets.back()}, device());
    dist::allgather(chunk_on_first(unit, [](const Piece& p) -> const Tensor& { return p.param; }), whole, group_);
    const std::vector<float> v = whole.to_vector();
    for (size_t i = 0; i < unit.params.size(); ++i)
      out[unit.params[i]].assign(v.begin() + unit.offsets[i], v.begin() + unit.offsets[i + 1]);
  }
  return out;
}

void RankParameterShards::set_parameters(const std::vector<std::vector<float>>& full) {
  for (Unit& unit : units_)
    for (Piece& p : unit.pieces) {
      if (p.n == 0) continue;
      std::vector<float> flat(static_cast<size_t>(p.n));
      each_unit_piece(unit.offsets, p.lo, p.lo + p.n, [&](size_t i, int64_t a, int64_t b) {
        const auto& from = full.at(unit.params[i]);
        std::copy(from.begin() + (a - unit.offsets[i]), from.begin() + (b - unit.offsets[i]), flat.begin() + (a - p.lo));
      });
      copy_bytes(Tensor::from_vector(flat, {p.n}, p.param.device()), 0, p.param, 0, static_cast<size_t>(p.n) * kBytesPerFloat);
    }
}

std::vector<std::vector<std::vector<float>>> RankParameterShards::gather_state() const {
  if (!placed()) return {};
  std::vector<std::vector<std::vector<float>>> out(replicas_.size(), std::vector<std::vector<float>>(slots_));
  for (const Unit& unit : units_)
    for (size_t j = 0; j < slots_; ++j) {
      const Tensor whole = Tensor::empty({unit.offsets.back()}, device());
      dist::allgather(chunk_on_first(unit, [j](const Piece& p) -> const Tensor& { return p.state[j]; }), whole, group_);
      const std::vector<float> v = whole.to_vector();
      for (size_t i = 0; i < unit.params.size(); ++i)
        out[unit.params[i]][j].assign(v.begin() + unit.offsets[i], v.begin() + unit.offsets[i + 1]);
    }
  return out;
}

static int64_t bytes_held(const Tensor& t) {
  return t.defined() && t.impl().storage ? t.numel() * static_cast<int64_t>(kBytesPerFloat) : 0;
}

int64_t RankParameterShards::parameter_bytes() const {
  int64_t n = 0;
  for (const Unit& unit : units_)
    for (const Piece& p : unit.pieces) n += bytes_held(p.param);
  return n;
}

int64_t RankParameterShards::gradient_bytes() const {
  int64_t n = 0;
  for (const Unit& unit : units_)
    for (const Piece& p : unit.pieces) n += bytes_held(p.grad);
  return n;
}

int64_t RankParameterShards::state_bytes() const {
  int64_t n = 0;
  for (const Unit& unit : units_)
    for (const Piece& p : unit.pieces)
      for (const Tensor& t : p.state) n += bytes_held(t);
  return n;
}

void RankParameterShards::add_memory(const std::function<DeviceMemory&(Device)>& at) const {
  if (!placed()) return;  // the replicas are released: the pieces are all this rank keeps
  for (const Unit& unit : units_)
    for (const Piece& p : unit.pieces) {
      DeviceMemory& m = at(p.param.device());
      m.parameter_bytes += bytes_held(p.param);
      m.summed_gradient_bytes += bytes_held(p.grad);
      for (const Tensor& t : p.state) m.state_bytes += bytes_held(t);
    }
}

int64_t RankParameterShards::chunk() const {
  int64_t n = 0;
  for (const Unit& unit : units_) n += unit.n;
  return n;
}

Tensor RankParameterShards::chunk_on_first(const Unit& unit, const std::function<const Tensor&(const Piece&)>& field) const {
  if (unit.pieces.size() == 1) return field(unit.pieces[0]);
  Tensor chunk = Tensor::empty({unit.n}, device());  // the pieces end to end on the first device
  for (const Piece& p : unit.pieces)
    if (p.n > 0)
      copy_bytes(field(p), 0, chunk, static_cast<size_t>(p.lo - unit.lo) * kBytesPerFloat, static_cast<size_t>(p.n) * kBytesPerFloat);
  return chunk;
}

std::vector<int64_t> RankParameterShards::unit_sizes() const {
  std::vector<int64_t> out;
  for (const Unit& unit : units_) out.push_back(unit.offsets.back());
  return out;
}

}  // namespace d2l::optim::zero
