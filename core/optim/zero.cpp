#include "core/optim/zero.hpp"

#include <algorithm>

#include "core/allocator.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/ops.hpp"
#include "core/parameter.hpp"
#include "core/runtime.hpp"

namespace d2l::optim::zero {

namespace {

constexpr size_t kFloat = sizeof(float);

// Calls f(k, a, b) for every parameter k that has elements in shard i, with [a, b) the flat range
// of its elements that lie there.
template <class F>
void for_pieces(const ShardLayout& layout, size_t i, F f) {
  const int64_t lo = layout.bounds[i], hi = layout.bounds[i + 1];
  for (size_t k = 0; k + 1 < layout.offsets.size(); ++k) {
    const int64_t a = std::max(lo, layout.offsets[k]), b = std::min(hi, layout.offsets[k + 1]);
    if (a < b) f(k, a, b);
  }
}

// Elements [from, from + n) of t (flattened) as a new tensor of `shape` on device d.
Tensor slice_to(const Tensor& t, int64_t from, int64_t n, const Shape& shape, Device d) {
  Tensor out = Tensor::empty(shape, d);
  copy_bytes(t, static_cast<size_t>(from) * kFloat, out, 0, static_cast<size_t>(n) * kFloat);
  return out;
}

int64_t bytes_of(const Tensor& t) {
  return t.defined() && t.impl().storage ? t.numel() * static_cast<int64_t>(kFloat) : 0;
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

Shape ShardedState::piece_shape(const Piece& p) const { return p.whole ? shapes_[p.k] : Shape{p.b - p.a}; }

bool ShardedState::fits(const std::vector<std::vector<Tensor>>& weights) const {
  if (!placed() || weights.size() + 1 != layout_.offsets.size()) return false;
  for (size_t k = 0; k < weights.size(); ++k) {
    if (weights[k].size() != devices_.size() || weights[k][0].numel() != layout_.offsets[k + 1] - layout_.offsets[k])
      return false;
    for (size_t i = 0; i < devices_.size(); ++i)
      if (weights[k][i].device() != devices_[i]) return false;
  }
  return true;
}

std::vector<std::vector<std::vector<float>>> ShardedState::gather_state() const {
  if (!placed()) return {};
  const size_t params = layout_.offsets.size() - 1;
  std::vector<std::vector<std::vector<float>>> out(params, std::vector<std::vector<float>>(slots_));
  for (size_t k = 0; k < params; ++k)
    for (auto& slot : out[k]) slot.resize(static_cast<size_t>(layout_.offsets[k + 1] - layout_.offsets[k]));
  for (auto& pieces : pieces_)
    for (const Piece& p : pieces)
      for (size_t j = 0; j < slots_; ++j) {
        const std::vector<float> v = p.state[j].to_vector();
        std::copy(v.begin(), v.end(), out[p.k][j].begin() + (p.a - layout_.offsets[p.k]));
      }
  return out;
}

void ShardedState::place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                         std::vector<std::vector<std::vector<float>>>& host) {
  // The pieces may already hold this step's gradients (a state loaded between the backward and the
  // step): the same replicas keep them.
  const bool keep_sums = placed() && fits(weights);
  std::vector<std::vector<Tensor>> sums;  // kept: [i][piece]
  if (keep_sums)
    for (auto& pieces : pieces_) {
      sums.emplace_back();
      for (auto& p : pieces) sums.back().push_back(p.grad);
    }
  // One flat vector needs one list of devices: every parameter on the first one's.
  const std::vector<Device> devices = common_devices(weights, names, 3);
  std::vector<int64_t> sizes;
  std::vector<Shape> shapes;
  for (size_t k = 0; k < weights.size(); ++k) {
    sizes.push_back(weights[k][0].numel());
    shapes.push_back(weights[k][0].shape());
  }
  // The unsharded values: loaded ones, else what the shards hold so far (a move), else zeros.
  if (!loaded_state_waits(host) && placed()) host = gather_state();
  for (size_t k = 0; k < sizes.size(); ++k) check_loaded_slots(names, host, k, sizes[k]);

  std::vector<std::vector<Tensor>> params;  // the parameter pieces already kept
  for (auto& pieces : pieces_) {
    params.emplace_back();
    for (auto& p : pieces) params.back().push_back(p.param);
  }
  layout_ = shard_layout(sizes, devices.size());
  devices_ = devices;
  shapes_ = shapes;
  pieces_.assign(devices.size(), {});
  MemoryTagScope tag(MemoryTag::optimizer_state);
  for (size_t i = 0; i < devices.size(); ++i)
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      Piece p{k, a, b, a == layout_.offsets[k] && b == layout_.offsets[k + 1], {}, {}, {}};
      for (size_t j = 0; j < slots_; ++j) {
        const auto& from = host[k][j];
        p.state.push_back(from.empty() ? Tensor::zeros(piece_shape(p), devices[i])
                                       : Tensor::from_vector(std::vector<float>(from.begin() + (a - layout_.offsets[k]),
                                                                                from.begin() + (b - layout_.offsets[k])),
                                                             piece_shape(p), devices[i]));
      }
      pieces_[i].push_back(std::move(p));
    });
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
  if (keep_sums || !params.empty())  // the same layout as before (the shards never move): the kept tensors back
    for (size_t i = 0; i < pieces_.size() && i < params.size(); ++i)
      for (size_t q = 0; q < pieces_[i].size() && q < params[i].size(); ++q) {
        pieces_[i][q].param = params[i][q];
        if (keep_sums) pieces_[i][q].grad = sums[i][q];
      }
  if (keep_sums) return;
  stale_ = false;
  weights_ = weights;
}

ShardedState::ShardedState(size_t slots) : slots_(slots) {}

void ShardedState::add_gradient(size_t k, size_t i) {
  const Tensor g = weights_[k][i].grad();
  if (!g.defined()) return;
  if (stale_) {  // the first gradient since the last step: the last step's sums go
    for (auto& pieces : pieces_)
      for (auto& p : pieces) p.grad = Tensor();
    stale_ = false;
  }
  // Reduce-scatter, one contribution at a time: each shard's slice of this gradient is added into
  // that shard's piece of parameter k, on the shard's device. Contributions arrive in device order
  // (backward runs device after device), so each sum is g0 + g1 + ... as the 'device' kvstore adds.
  MemoryTagScope tag(MemoryTag::summed_gradients);
  for (size_t j = 0; j < devices_.size(); ++j)
    for (Piece& p : pieces_[j]) {
      if (p.k != k) continue;
      const bool local = j == i && p.whole;  // this device's own whole piece: the .grad buffer itself
      if (!p.grad.defined() && local) {
        p.grad = g;  // taken over as the sum, no copy
        runtime(devices_[j]).allocator->retag(g.impl().storage->ptr, MemoryTag::summed_gradients);
      } else {
        const Tensor part = local ? g : slice_to(g, p.a - layout_.offsets[k], p.b - p.a, piece_shape(p), devices_[j]);
        if (p.grad.defined()) add_(p.grad, part);
        else p.grad = part;
      }
    }
  weights_[k][i].impl().grad.reset();
}

Step ShardedState::clipped(const std::vector<std::vector<Tensor>>& g, const Step& s, GradClip* clip) {
  if (!clip) return s;
  double squares = 0;
  for (size_t i = 0; i < g.size(); ++i)  // device by device
    for (const Tensor& piece : g[i]) squares += sum_of_squares(piece);
  return clip->apply(s, squares);
}

void ShardedState::step(const StepInput& in, const Step& s, GradClip* clip) {
  // Each device updates its parameter shard; the next forward gathers.
  if (!placed()) throw run_through_fsdp();
  if (loaded_state_waits(in.host)) shard_parameters(in, units_);
  step_shards(s, clip);
}

void ShardedState::add_memory(const std::function<DeviceMemory&(Device)>& at) const {
  for (size_t i = 0; i < devices_.size(); ++i) {
    DeviceMemory& m = at(devices_[i]);
    m.state_bytes += bytes(i);
    m.summed_gradient_bytes += gradient_bytes(i);
    m.parameter_bytes += parameter_bytes(i);
  }
}

void ShardedState::replicate_over(const dist::Group& group) { replicas_ = group; }

void ShardedState::sum_over_replicas(const std::vector<std::vector<Tensor>>& g) const {
  if (!replicas_ || replicas_->size() == 1) return;
  for (const auto& pieces : g)  // every rank's devices hold the same layout: piece by piece, in the same order
    for (const Tensor& piece : pieces) dist::allreduce(piece, *replicas_);
}

std::vector<std::vector<Tensor>> ShardedState::take_sums() {
  std::vector<std::vector<Tensor>> g(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i)
    for (Piece& p : pieces_[i]) {
      if (!p.grad.defined() || stale_) {  // no gradient reached this piece: zero
        MemoryTagScope tag(MemoryTag::summed_gradients);
        p.grad = Tensor::zeros(piece_shape(p), devices_[i]);
      }
      g[i].push_back(p.grad);
    }
  stale_ = true;  // kept (memory rows) until the next gradient arrives
  return g;
}

void ShardedState::shard_parameters(const StepInput& in, const std::vector<std::vector<size_t>>& units) {
  const auto& weights = in.weights;
  if (placed() && !fits(weights))
    throw ConfigError("Trainer: zero_stage 3 keeps the parameters where they were sharded, " + str(devices_) +
                      "; they cannot move (reset_ctx) afterwards");
  if (weights.empty()) return;
  const bool first = !placed() || pieces_.empty() || pieces_[0].empty() || !pieces_[0][0].param.defined();
  place(weights, in.names, in.host);  // the layout, the devices and the state
  units_ = units;
  if (!first) return;
  // Device i's own replica holds the same values as every other: its pieces are read from it. A
  // whole piece keeps the replica's buffer itself; a part is copied out.
  MemoryTagScope tag(MemoryTag::parameters);
  for (size_t i = 0; i < devices_.size(); ++i)
    for (Piece& p : pieces_[i]) {
      if (p.whole) {
        auto impl = std::make_shared<TensorImpl>();
        impl->shape = shapes_[p.k], impl->device = devices_[i], impl->storage = weights[p.k][i].impl().storage;
        p.param = Tensor(impl);
      } else {
        p.param = slice_to(weights[p.k][i], p.a - layout_.offsets[p.k], p.b - p.a, piece_shape(p), devices_[i]);
      }
    }
  for (size_t k = 0; k < weights_.size(); ++k)
    for (size_t i = 0; i < devices_.size(); ++i) release_parameter(k, i);
}

void ShardedState::gather_parameter(size_t k, size_t i) {
  TensorImpl& t = weights_[k][i].impl();
  if (t.storage) return;
  for (const Piece& p : pieces_[i])
    if (p.k == k && p.whole) {  // device i's own piece: the replica is its buffer
      t.storage = p.param.impl().storage;
      return;
    }
  {
    MemoryTagScope tag(MemoryTag::gathered);
    t.storage = Tensor::empty(t.shape, t.device).storage();  // for its device's compute stream
  }
  // All-gather, for one replica: from every shard, the part of parameter k it holds.
  for (size_t j = 0; j < devices_.size(); ++j)
    for (const Piece& p : pieces_[j])
      if (p.k == k)
        copy_bytes(p.param, 0, weights_[k][i], static_cast<size_t>(p.a - layout_.offsets[k]) * kFloat,
                   static_cast<size_t>(p.b - p.a) * kFloat);
}

void ShardedState::release_parameter(size_t k, size_t i) {
  // The allocator takes the blocks back in stream order: kernels already queued still read them.
  TensorImpl& t = weights_[k][i].impl();
  t.storage.reset();
  t.grad.reset();
}

void ShardedState::gather_unit(size_t u, size_t i) {
  for (size_t k : units_[u]) gather_parameter(k, i);
}

void ShardedState::release_unit(size_t u, size_t i) {
  for (size_t k : units_[u]) release_parameter(k, i);
}

bool ShardedState::gathered(size_t k, size_t i) const { return weights_[k][i].impl().storage != nullptr; }

void ShardedState::step_shards(const Step& s, GradClip* clip) {
  for (size_t k = 0; k < weights_.size(); ++k)
    for (size_t i = 0; i < devices_.size(); ++i) release_parameter(k, i);
  const std::vector<std::vector<Tensor>> g = take_sums();
  sum_over_replicas(g);  // HYBRID_SHARD: device i of every rank holds shard i
  std::vector<ReplicaStep> mine;
  for (size_t i = 0; i < devices_.size(); ++i)
    for (const Piece& p : pieces_[i]) mine.push_back({p.param, p.state, p.grad});
  update_my_shard_then_all_gather(mine, clipped(g, s, clip));  // the shards in place, no gather
}

std::vector<std::vector<float>> ShardedState::parameters() const {
  std::vector<std::vector<float>> out;
  for (size_t k = 0; k + 1 < layout_.offsets.size(); ++k)
    out.emplace_back(static_cast<size_t>(layout_.offsets[k + 1] - layout_.offsets[k]));
  for (auto& pieces : pieces_)
    for (const Piece& p : pieces) {
      if (!p.param.defined()) continue;
      const std::vector<float> v = p.param.to_vector();
      std::copy(v.begin(), v.end(), out[p.k].begin() + (p.a - layout_.offsets[p.k]));
    }
  return out;
}

void ShardedState::set_parameters(const std::vector<std::vector<float>>& full) {
  for (size_t i = 0; i < pieces_.size(); ++i)
    for (Piece& p : pieces_[i]) {
      if (!p.param.defined()) continue;
      auto from = full.at(p.k).begin() + (p.a - layout_.offsets[p.k]);
      const Tensor values = Tensor::from_vector(std::vector<float>(from, from + (p.b - p.a)), piece_shape(p), devices_[i]);
      copy_bytes(values, 0, p.param, 0, static_cast<size_t>(p.b - p.a) * kFloat);  // a whole piece: its replica's buffer too
    }
}

int64_t ShardedState::parameter_bytes(size_t i) const {
  int64_t n = 0;
  if (i < pieces_.size())
    for (const Piece& p : pieces_[i]) n += bytes_of(p.param);
  return n;
}

int64_t ShardedState::bytes(size_t i) const {
  int64_t n = 0;
  if (i < pieces_.size())
    for (const Piece& p : pieces_[i])
      for (const Tensor& t : p.state) n += bytes_of(t);
  return n;
}

int64_t ShardedState::gradient_bytes(size_t i) const {
  int64_t n = 0;
  if (i < pieces_.size())
    for (const Piece& p : pieces_[i]) n += bytes_of(p.grad);
  return n;
}

}  // namespace d2l::optim::zero
