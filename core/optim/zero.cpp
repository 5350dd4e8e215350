#include "core/optim/zero.hpp"

#include <algorithm>

#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/ops.hpp"
#include "core/copy.hpp"
#include "core/parameter.hpp"

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

}  // namespace

ShardLayout shard_layout(const std::vector<int64_t>& sizes, size_t n) {
  ShardLayout l;
  l.offsets.push_back(0);
  for (int64_t s : sizes) l.offsets.push_back(l.offsets.back() + s);
  const int64_t total = l.offsets.back(), count = static_cast<int64_t>(n);
  l.bounds.push_back(0);
  for (int64_t i = 0; i < count; ++i)  // split_and_load's rule: the first total % n shards one larger
    l.bounds.push_back(l.bounds.back() + total / count + (i < total % count ? 1 : 0));
  return l;
}

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

std::vector<std::vector<std::vector<float>>> ShardedState::gather() const {
  if (!placed()) return {};
  const size_t params = layout_.offsets.size() - 1;
  std::vector<std::vector<std::vector<float>>> out(params, std::vector<std::vector<float>>(slots_));
  for (size_t k = 0; k < params; ++k)
    for (auto& slot : out[k]) slot.resize(static_cast<size_t>(layout_.offsets[k + 1] - layout_.offsets[k]));
  for (size_t i = 0; i < devices_.size(); ++i)
    for (size_t j = 0; j < slots_; ++j) {
      if (layout_.shard_size(i) == 0) continue;
      const std::vector<float> shard = state_[i][j].to_vector();
      for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
        std::copy(shard.begin() + (a - layout_.bounds[i]), shard.begin() + (b - layout_.bounds[i]),
                  out[k][j].begin() + (a - layout_.offsets[k]));
      });
    }
  return out;
}

void ShardedState::place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                         std::vector<std::vector<std::vector<float>>>& host) {
  // Stages 2 and 3: the pieces may already hold this step's gradients (a state loaded between the
  // backward and the step): the same replicas keep them.
  const bool keep_pieces = stage_ >= 2 && placed() && fits(weights);
  // Parameters moved after some of this step's gradients were added in (a replica kept across
  // reset_ctx reported its gradient to the old layout): the sums so far move to the new one.
  std::vector<float> carried;
  if (stage_ >= 2 && !keep_pieces && placed() && received_)
    for (size_t i = 0; i < devices_.size(); ++i) {
      const std::vector<float> shard = gradient_shard(i);
      carried.insert(carried.end(), shard.begin(), shard.end());
    }
  // One flat vector needs one list of devices: every parameter on the first one's.
  std::vector<Device> devices;
  for (auto& w : weights[0]) devices.push_back(w.device());
  std::vector<int64_t> sizes;
  for (size_t k = 0; k < weights.size(); ++k) {
    std::vector<Device> on;
    for (auto& w : weights[k]) on.push_back(w.device());
    if (on != devices)
      throw ConfigError("Trainer: zero_stage " + std::to_string(stage_) + " needs every trainable parameter on the same devices, in the same order: '" +
                        names[0] + "' is on " + str(devices) + ", '" + names[k] + "' on " + str(on));
    sizes.push_back(weights[k][0].numel());
  }
  // The unsharded values: loaded ones, else what the shards hold so far (a move), else zeros.
  const bool loaded = std::any_of(host.begin(), host.end(), [](auto& slots) { return !slots[0].empty(); });
  if (!loaded && placed()) host = gather();
  for (size_t k = 0; k < host.size(); ++k)
    for (size_t j = 0; j < slots_; ++j)
      if (!host[k][j].empty() && static_cast<int64_t>(host[k][j].size()) != sizes[k])
        throw ShapeError("Trainer: a slot of the optimizer state of '" + names[k] + "' has " +
                         std::to_string(host[k][j].size()) + " values but the parameter has " +
                         std::to_string(sizes[k]));

  layout_ = shard_layout(sizes, devices.size());
  devices_ = devices;
  state_.assign(devices.size(), std::vector<Tensor>(slots_));
  for (size_t i = 0; i < devices.size(); ++i) {
    const int64_t n = layout_.shard_size(i);
    if (n == 0) continue;  // more devices than elements: nothing to keep
    for (size_t j = 0; j < slots_; ++j) {
      std::vector<float> flat(static_cast<size_t>(n), 0.0f);
      for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
        const auto& from = host[k][j];
        if (!from.empty())
          std::copy(from.begin() + (a - layout_.offsets[k]), from.begin() + (b - layout_.offsets[k]),
                    flat.begin() + (a - layout_.bounds[i]));
      });
      state_[i][j] = Tensor::from_vector(flat, {n}, devices[i]);
    }
  }
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
  // Stages 2 and 3: the replicas (a gradient's parameter and device are found from its leaf), and
  // per device one summed-gradient piece for each parameter part its shard holds, added into as the
  // gradients arrive.
  if (stage_ < 2 || keep_pieces) return;
  weights_.clear(), pieces_.clear(), replica_.clear();
  stale_ = false;
  weights_ = weights;
  pieces_.assign(devices.size(), {});
  for (size_t i = 0; i < devices.size(); ++i)
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      pieces_[i].push_back(Piece{k, a, b, Tensor::zeros({b - a}, devices[i])});
    });
  for (size_t k = 0; k < weights.size(); ++k)
    for (size_t i = 0; i < devices.size(); ++i) replica_[&weights[k][i].impl()] = {k, i};
  if (carried.empty()) return;
  for (auto& pieces : pieces_)
    for (auto& piece : pieces)
      piece.grad = Tensor::from_vector(std::vector<float>(carried.begin() + piece.a, carried.begin() + piece.b),
                                       {piece.b - piece.a}, piece.grad.device());
  received_ = true;
}

ShardedState::ShardedState(size_t slots, int stage) : slots_(slots), stage_(stage) {
  // Stage 2: each gradient is reduce-scattered the moment backward completes it (FSDP does the same
  // at stage 3 with its own hook, which also releases the unit's parameters).
  if (stage_ == 2) hook_ = add_grad_ready_hook([this](TensorImpl& leaf) { scatter_if_mine(leaf); });
}

ShardedState::~ShardedState() {
  if (hook_ >= 0) remove_grad_ready_hook(hook_);
}

void ShardedState::scatter_if_mine(TensorImpl& leaf) {
  auto it = replica_.find(&leaf);
  if (it != replica_.end()) scatter_gradient(it->second.first, it->second.second);
}

void ShardedState::scatter_remaining() {
  for (size_t k = 0; k < weights_.size(); ++k)
    for (size_t i = 0; i < devices_.size(); ++i)
      if (weights_[k][i].grad().defined()) scatter_gradient(k, i);
}

std::vector<Tensor> ShardedState::summed_gradients() {
  if (stale_) {  // no gradient since the last step: it is zero
    for (auto& pieces : pieces_)
      for (auto& piece : pieces) fill_(piece.grad, 0.0f);
    stale_ = false;
  }
  std::vector<Tensor> g(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t n = layout_.shard_size(i), lo = layout_.bounds[i];
    if (n == 0) continue;
    g[i] = Tensor::empty({n}, devices_[i]);
    for (const Piece& piece : pieces_[i])
      copy_bytes(piece.grad, 0, g[i], static_cast<size_t>(piece.a - lo) * kFloat,
                 static_cast<size_t>(piece.b - piece.a) * kFloat);
  }
  stale_ = true;  // kept for reading (gradient_shard) until the next gradient arrives
  received_ = false;
  return g;
}

std::vector<float> ShardedState::gradient_shard(size_t i) const {
  std::vector<float> out(static_cast<size_t>(layout_.shard_size(i)));
  for (const Piece& piece : pieces_[i]) {
    const std::vector<float> v = piece.grad.to_vector();
    std::copy(v.begin(), v.end(), out.begin() + (piece.a - layout_.bounds[i]));
  }
  return out;
}

void ShardedState::step(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& grads,
                        const Step& s) {
  // Stage 1: device i copies its shard of the summed gradient (the same on every device) into a flat buffer.
  std::vector<Tensor> g(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t n = layout_.shard_size(i), lo = layout_.bounds[i];
    if (n == 0) continue;
    g[i] = Tensor::empty({n}, devices_[i]);
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      copy_bytes(grads[k][i], static_cast<size_t>(a - layout_.offsets[k]) * kFloat, g[i],
                 static_cast<size_t>(a - lo) * kFloat, static_cast<size_t>(b - a) * kFloat);
    });
  }
  update_and_gather(weights, g, s);
}

void ShardedState::scattered_step(const std::vector<std::vector<Tensor>>& weights, const Step& s) {
  scatter_remaining();  // gradients made before the layout existed (the first step), or not reported
  update_and_gather(weights, summed_gradients(), s);
}

void ShardedState::update_and_gather(const std::vector<std::vector<Tensor>>& weights, const std::vector<Tensor>& g,
                                     const Step& s) {
  // Device i: its shard of the weights in a flat buffer, updated from the shard's summed gradient
  // g[i] with its own state. Every device's kernels are queued before any waits: the devices run together.
  std::vector<Tensor> updated(devices_.size());
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t n = layout_.shard_size(i), lo = layout_.bounds[i];
    if (n == 0) continue;
    Tensor w = Tensor::empty({n}, devices_[i]);
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      copy_bytes(weights[k][i], static_cast<size_t>(a - layout_.offsets[k]) * kFloat, w,
                 static_cast<size_t>(a - lo) * kFloat, static_cast<size_t>(b - a) * kFloat);
    });
    step_on_device(w, state_[i], g[i], s);
    updated[i] = w;
  }
  // All-gather: shard i's new values into every replica, its own device's included.
  for (size_t i = 0; i < devices_.size(); ++i) {
    if (!updated[i].defined()) continue;
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      const size_t from = static_cast<size_t>(a - layout_.bounds[i]) * kFloat;
      const size_t to = static_cast<size_t>(a - layout_.offsets[k]) * kFloat;
      for (auto& replica : weights[k]) copy_bytes(updated[i], from, replica, to, static_cast<size_t>(b - a) * kFloat);
    });
  }
}

void ShardedState::shard_parameters(const std::vector<std::vector<Tensor>>& weights,
                                    const std::vector<std::string>& names,
                                    std::vector<std::vector<std::vector<float>>>& host) {
  const bool first = param_shards_.empty();
  place(weights, names, host);  // the layout, the devices and the state, as at stages 1 and 2
  if (!first) return;
  param_shards_.assign(devices_.size(), Tensor());
  for (size_t i = 0; i < devices_.size(); ++i) {
    const int64_t n = layout_.shard_size(i), lo = layout_.bounds[i];
    if (n == 0) continue;
    // Device i's own replica holds the same values as every other: its shard is a local copy.
    param_shards_[i] = Tensor::empty({n}, devices_[i]);
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      copy_bytes(weights[k][i], static_cast<size_t>(a - layout_.offsets[k]) * kFloat, param_shards_[i],
                 static_cast<size_t>(a - lo) * kFloat, static_cast<size_t>(b - a) * kFloat);
    });
  }
  for (size_t k = 0; k < weights_.size(); ++k)
    for (size_t i = 0; i < devices_.size(); ++i) release_parameter(k, i);
}

void ShardedState::gather_parameter(size_t k, size_t i) {
  TensorImpl& t = weights_[k][i].impl();
  if (t.storage) return;
  t.storage = Tensor::empty(t.shape, t.device).storage();  // for its device's compute stream
  // All-gather, for one replica: from every shard, the part of parameter k it holds.
  const int64_t lo = layout_.offsets[k], hi = layout_.offsets[k + 1];
  for (size_t j = 0; j < devices_.size(); ++j) {
    const int64_t a = std::max(lo, layout_.bounds[j]), b = std::min(hi, layout_.bounds[j + 1]);
    if (a < b)
      copy_bytes(param_shards_[j], static_cast<size_t>(a - layout_.bounds[j]) * kFloat, weights_[k][i],
                 static_cast<size_t>(a - lo) * kFloat, static_cast<size_t>(b - a) * kFloat);
  }
}

void ShardedState::release_parameter(size_t k, size_t i) {
  // The allocator takes the blocks back in stream order: kernels already queued still read them.
  TensorImpl& t = weights_[k][i].impl();
  t.storage.reset();
  t.grad.reset();
}

bool ShardedState::gathered(size_t k, size_t i) const { return weights_[k][i].impl().storage != nullptr; }

void ShardedState::scatter_gradient(size_t k, size_t i) {
  const Tensor g = weights_[k][i].grad();
  if (!g.defined()) return;
  if (stale_) {  // the first gradient since the last step: the pieces start again from zero
    for (auto& pieces : pieces_)
      for (auto& piece : pieces) fill_(piece.grad, 0.0f);
    stale_ = false;
  }
  received_ = true;
  // Reduce-scatter, one contribution at a time: each shard's part of this gradient is added into
  // that shard's piece of parameter k, on the shard's device.
  for (size_t j = 0; j < devices_.size(); ++j)
    for (Piece& piece : pieces_[j]) {
      if (piece.k != k) continue;
      const Tensor recv = Tensor::empty({piece.b - piece.a}, devices_[j]);
      copy_bytes(g, static_cast<size_t>(piece.a - layout_.offsets[k]) * kFloat, recv, 0,
                 static_cast<size_t>(piece.b - piece.a) * kFloat);
      add_(piece.grad, recv);
    }
  weights_[k][i].impl().grad.reset();
}

void ShardedState::step_shards(const Step& s) {
  for (size_t k = 0; k < weights_.size(); ++k)
    for (size_t i = 0; i < devices_.size(); ++i) release_parameter(k, i);
  const std::vector<Tensor> g = summed_gradients();
  for (size_t i = 0; i < devices_.size(); ++i)
    if (g[i].defined()) step_on_device(param_shards_[i], state_[i], g[i], s);
}

std::vector<std::vector<float>> ShardedState::parameters() const {
  std::vector<std::vector<float>> out;
  for (size_t k = 0; k + 1 < layout_.offsets.size(); ++k)
    out.emplace_back(static_cast<size_t>(layout_.offsets[k + 1] - layout_.offsets[k]));
  for (size_t i = 0; i < param_shards_.size(); ++i) {
    if (!param_shards_[i].defined()) continue;
    const std::vector<float> shard = param_shards_[i].to_vector();
    for_pieces(layout_, i, [&](size_t k, int64_t a, int64_t b) {
      std::copy(shard.begin() + (a - layout_.bounds[i]), shard.begin() + (b - layout_.bounds[i]),
                out[k].begin() + (a - layout_.offsets[k]));
    });
  }
  return out;
}

int64_t ShardedState::parameter_bytes(size_t i) const {
  return i < param_shards_.size() && param_shards_[i].defined() ? static_cast<int64_t>(kFloat) * param_shards_[i].numel() : 0;
}

int64_t ShardedState::bytes(size_t i) const {
  return placed() ? static_cast<int64_t>(slots_ * kFloat) * layout_.shard_size(i) : 0;
}

int64_t ShardedState::gradient_bytes(size_t i) const {
  return i < pieces_.size() ? static_cast<int64_t>(kFloat) * layout_.shard_size(i) : 0;
}

}  // namespace d2l::optim::zero
