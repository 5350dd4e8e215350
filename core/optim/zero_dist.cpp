#include "core/optim/zero_dist.hpp"

#include <algorithm>
#include <cstdlib>

#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"

namespace d2l::optim::zero {

namespace {

constexpr size_t kFloatBytes = sizeof(float);

// Calls f(k, a, b) for every parameter k with elements in [lo, hi), [a, b) the flat range of them there.
template <class F>
void each_piece_between(const ShardLayout& layout, int64_t lo, int64_t hi, F f) {
  for (size_t k = 0; k + 1 < layout.offsets.size(); ++k) {
    const int64_t a = std::max(lo, layout.offsets[k]), b = std::min(hi, layout.offsets[k + 1]);
    if (a < b) f(k, a, b);
  }
}

// Copies the flat range [lo, lo + n) of the parameters' tensors (per parameter, one each) into flat
// (n elements), or back when `into_params`.
void copy_flat(const ShardLayout& layout, const std::vector<Tensor>& tensors, int64_t lo, int64_t n, const Tensor& flat,
               bool into_params) {
  each_piece_between(layout, lo, lo + n, [&](size_t k, int64_t a, int64_t b) {
    const size_t in_param = static_cast<size_t>(a - layout.offsets[k]) * kFloatBytes;
    const size_t in_flat = static_cast<size_t>(a - lo) * kFloatBytes, bytes = static_cast<size_t>(b - a) * kFloatBytes;
    if (into_params) copy_bytes(flat, in_flat, tensors[k], in_param, bytes);
    else copy_bytes(tensors[k], in_param, flat, in_flat, bytes);
  });
}

}  // namespace

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

ShardLayout rank_layout(const std::vector<int64_t>& sizes) {
  ShardLayout l;
  l.offsets.push_back(0);
  for (int64_t s : sizes) l.offsets.push_back(l.offsets.back() + s);
  for (int r = 0; r <= dist::world_size(); ++r) l.bounds.push_back(dist::chunk_begin(l.offsets.back(), r));
  return l;
}

int64_t RankShardedState::lo() const { return layout_.bounds[static_cast<size_t>(dist::rank())]; }
int64_t RankShardedState::chunk() const { return layout_.shard_size(static_cast<size_t>(dist::rank())); }

bool RankShardedState::fits(const std::vector<std::vector<Tensor>>& weights) const {
  if (!placed_ || weights.size() + 1 != layout_.offsets.size()) return false;
  for (size_t k = 0; k < weights.size(); ++k)
    if (weights[k].size() != 1 || weights[k][0].device() != device_ ||
        weights[k][0].numel() != layout_.offsets[k + 1] - layout_.offsets[k])
      return false;
  return true;
}

void RankShardedState::place(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                             std::vector<std::vector<std::vector<float>>>& host) {
  // The paper's setting, one device per process: the chunk is this process's, on its device.
  const std::string stage = std::to_string(stage_);
  std::vector<int64_t> sizes;
  for (size_t k = 0; k < weights.size(); ++k) {
    std::vector<Device> on;
    for (auto& w : weights[k]) on.push_back(w.device());
    if (on.size() != 1)
      throw ConfigError("Trainer: zero_stage " + stage + " with a dist kvstore shards over the processes, one device "
                        "each, but '" + names[k] + "' is on " + str(on) + " in rank " + std::to_string(dist::rank()) +
                        ": give each process one device");
    if (on[0] != weights[0][0].device())
      throw ConfigError("Trainer: zero_stage " + stage + " needs every trainable parameter on one device: '" + names[0] +
                        "' is on " + str(std::vector<Device>{weights[0][0].device()}) + ", '" + names[k] + "' on " + str(on));
    sizes.push_back(weights[k][0].numel());
  }
  // The unsharded values: loaded ones, else the chunks kept so far (the parameters moved), else zeros.
  const bool loaded = std::any_of(host.begin(), host.end(), [](auto& slots) { return !slots[0].empty(); });
  if (!loaded && placed_) host = gather();
  for (size_t k = 0; k < host.size(); ++k)
    for (auto& slot : host[k])
      if (!slot.empty() && static_cast<int64_t>(slot.size()) != sizes[k])
        throw ShapeError("Trainer: a slot of the optimizer state of '" + names[k] + "' has " +
                         std::to_string(slot.size()) + " values but the parameter has " + std::to_string(sizes[k]));
  layout_ = rank_layout(sizes);
  device_ = weights[0][0].device();
  const int64_t n = chunk(), first = lo();
  state_.assign(slots_, Tensor());
  for (size_t j = 0; j < slots_; ++j) {
    std::vector<float> flat(static_cast<size_t>(n), 0.0f);
    each_piece_between(layout_, first, first + n, [&](size_t k, int64_t a, int64_t b) {
      const auto& from = host[k][j];
      if (!from.empty())
        std::copy(from.begin() + (a - layout_.offsets[k]), from.begin() + (b - layout_.offsets[k]), flat.begin() + (a - first));
    });
    state_[j] = Tensor::from_vector(flat, {n}, device_);
  }
  for (auto& slots : host)
    for (auto& slot : slots) slot.clear();
  grad_shard_ = stage_ == 2 ? Tensor::empty({n}, device_) : Tensor();
  for (auto& w : pending_) w.wait();  // launched into the old layout: redone at the step
  pending_.clear();
  replicas_.clear(), index_.clear();
  for (size_t k = 0; k < weights.size(); ++k) {
    replicas_.push_back(weights[k][0]);
    index_[&weights[k][0].impl()] = k;
  }
  scattered_.assign(weights.size(), false);
  placed_ = true;
}

RankShardedState::RankShardedState(size_t slots, int stage) : slots_(slots), stage_(stage) {
  if (stage_ == 2)
    hook_ = add_grad_ready_hook([this](TensorImpl& leaf) {
      auto it = index_.find(&leaf);
      if (placed_ && it != index_.end()) scatter(it->second);
    });
}

RankShardedState::~RankShardedState() {
  if (hook_ >= 0) remove_grad_ready_hook(hook_);
}

void RankShardedState::scatter(size_t k) {
  // Parameter k's elements [a, b) of the flat vector: rank r receives those inside its chunk.
  const int W = dist::world_size();
  const int64_t a = layout_.offsets[k], b = layout_.offsets[k + 1];
  std::vector<int64_t> counts;
  for (int r = 0; r < W; ++r)
    counts.push_back(std::max<int64_t>(0, std::min(b, layout_.bounds[r + 1]) - std::max(a, layout_.bounds[r])));
  const Tensor& w = replicas_[k];
  const Tensor g = w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), w.device());
  pending_.push_back(dist::reduce_scatter_async(g, grad_shard_, std::clamp<int64_t>(a - lo(), 0, chunk()), counts));
  scattered_[k] = true;
}

void RankShardedState::step(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                            std::vector<std::vector<std::vector<float>>>& host, KVStore& kv, bool summed, const Step& s) {
  NoGrad no_grad;
  const bool loaded = std::any_of(host.begin(), host.end(), [](auto& slots) { return !slots[0].empty(); });
  if (loaded || !fits(weights)) place(weights, names, host);  // checks the devices before any collective
  if (stage_ == 2 && summed)
    throw ConfigError("Trainer: zero_stage 2 reduce-scatters the gradients, but the gradient buckets already all-reduced "
                      "them: use zero_stage 1 with buckets");
  std::vector<Tensor> params, grads;
  for (auto& replicas : weights) {
    const Tensor& w = replicas[0];
    params.push_back(w);
    grads.push_back(w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), w.device()));
  }
  const int64_t P = layout_.total(), n = chunk(), first = lo();
  Tensor flat = Tensor::empty({P}, device_);  // stage 2's packed gradients, then the gathered weights
  Tensor g;
  if (stage_ == 1) {
    // Data parallelism's allreduce (dist_sync's pushpull, unless the buckets did it during backward),
    // of which this rank reads chunk r only.
    if (!summed)
      for (size_t k = 0; k < grads.size(); ++k) kv.pushpull(static_cast<int64_t>(k), {grads[k]});
    g = Tensor::empty({n}, device_);
    copy_flat(layout_, grads, first, n, g, false);
  } else {
    // Chunk r's sum arrives here, no other: most gradients were reduce-scattered during backward;
    // the others (all of them at the first step, any backward did not reach) go now, in parameter
    // order, the same on every rank.
    for (size_t k = 0; k < scattered_.size(); ++k)
      if (!scattered_[k]) scatter(k);
    for (auto& work : pending_) work.wait();
    pending_.clear();
    scattered_.assign(scattered_.size(), false);
    g = grad_shard_;
  }
  Tensor w = Tensor::empty({n}, device_);
  copy_flat(layout_, params, first, n, w, false);
  if (n > 0) step_on_device(w, state_, g, s);
  ++steps_;
  if (steps_ == 2 && fails_in_allgather(stage_))
    throw DeviceError("injected failure inside the ZeRO-" + std::to_string(stage_) + " all-gather of step 2 "
                      "(D2L_FAIL_RANK_IN_ALLGATHER=" + std::getenv("D2L_FAIL_RANK_IN_ALLGATHER") + ")");
  // All-gather: every rank's updated chunk into every rank's flat vector, then into the parameters.
  dist::allgather(w, flat);
  copy_flat(layout_, params, 0, P, flat, true);
}

std::vector<std::vector<std::vector<float>>> RankShardedState::gather() const {
  if (!placed_) return {};
  const size_t params = layout_.offsets.size() - 1;
  std::vector<std::vector<std::vector<float>>> out(params, std::vector<std::vector<float>>(slots_));
  for (size_t j = 0; j < slots_; ++j) {
    Tensor whole = Tensor::empty({layout_.total()}, device_);
    dist::allgather(state_[j], whole);
    const std::vector<float> v = whole.to_vector();
    for (size_t k = 0; k < params; ++k)
      out[k][j].assign(v.begin() + layout_.offsets[k], v.begin() + layout_.offsets[k + 1]);
  }
  return out;
}

int64_t RankShardedState::bytes() const {
  return placed_ ? static_cast<int64_t>(slots_ * kFloatBytes) * chunk() : 0;
}

int64_t RankShardedState::gradient_bytes() const {
  return grad_shard_.defined() ? static_cast<int64_t>(kFloatBytes) * grad_shard_.numel() : 0;
}

}  // namespace d2l::optim::zero
