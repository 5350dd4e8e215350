#include "core/optim/trainer.hpp"

#include <algorithm>
#include <cmath>
#include <set>
#include <sstream>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/optim/kvstore.hpp"
#include "core/optim/zero.hpp"

namespace d2l::optim {

const char* shard_over_name(ShardOver s) {
  return s == ShardOver::ranks ? "ranks" : s == ShardOver::devices ? "devices" : "all_devices";
}

namespace {

std::string num(double v) {
  std::ostringstream os;
  os << v;
  return os.str();
}

void check_options(const std::string& optimizer, const OptimizerOptions& o) {
  if (!std::isfinite(o.learning_rate) || o.learning_rate < 0)
    throw ConfigError("Trainer: learning_rate must be a finite number >= 0, got " + num(o.learning_rate));
  if (!std::isfinite(o.wd) || o.wd < 0) throw ConfigError("Trainer: wd must be a finite number >= 0, got " + num(o.wd));
  if (!std::isfinite(o.clip_grad_norm) || o.clip_grad_norm < 0)
    throw ConfigError("Trainer: clip_grad_norm must be a finite number >= 0 (0: off), got " + num(o.clip_grad_norm));
  if (o.zero_stage < 0 || o.zero_stage > 3)
    throw ConfigError("Trainer: zero_stage must be 0 (optimizer state replicated), 1 (ZeRO-1: optimizer state sharded "
                      "over the devices), 2 (ZeRO-2: optimizer state and summed gradients sharded) or 3 (ZeRO-3: "
                      "parameters sharded too), got " + std::to_string(o.zero_stage));
  const OptimizerOptions defaults;
  if (optimizer == "sgd") {
    if (!(o.momentum >= 0 && o.momentum <= 1))
      throw ConfigError("Trainer: momentum must be in [0, 1], got " + num(o.momentum));
    if (o.beta1 != defaults.beta1 || o.beta2 != defaults.beta2 || o.epsilon != defaults.epsilon)
      throw ConfigError("Trainer: beta1, beta2 and epsilon are Adam's; optimizer 'sgd' takes learning_rate, momentum and wd");
    return;
  }
  if (o.momentum != defaults.momentum)
    throw ConfigError("Trainer: momentum is SGD's; optimizer 'adam' takes learning_rate, wd, beta1, beta2 and epsilon "
                      "(beta1 is its momentum), got momentum " + num(o.momentum));
  if (!(o.beta1 >= 0 && o.beta1 < 1)) throw ConfigError("Trainer: beta1 must be in [0, 1), got " + num(o.beta1));
  if (!(o.beta2 >= 0 && o.beta2 < 1)) throw ConfigError("Trainer: beta2 must be in [0, 1), got " + num(o.beta2));
  if (!std::isfinite(o.epsilon) || o.epsilon < 0)
    throw ConfigError("Trainer: epsilon must be a finite number >= 0, got " + num(o.epsilon));
}

const char* kNumUpdate = "num_update";
const char* kLearningRate = "learning_rate";
std::string state_key(const std::string& slot, const std::string& name) { return slot + "/" + name; }

// A one-value entry of a state dict ("num_update", "learning_rate").
float scalar_of(const std::map<std::string, HostTensor>& state, const std::string& key) {
  auto it = state.find(key);
  if (it == state.end()) throw ParameterError("Trainer.load_state_dict: no '" + key + "' in the trainer state");
  if (it->second.values.size() != 1 || numel(it->second.shape) != 1)
    throw ShapeError("Trainer.load_state_dict: '" + key + "' must hold one value, it has shape " + str(it->second.shape));
  return it->second.values[0];
}

}  // namespace

Trainer::Trainer(const nn::ParameterDict& params, const std::string& optimizer, OptimizerOptions options,
                 const std::string& kvstore)
    : optimizer_(optimizer), options_(options), last_grad_norm_(std::nanf("")) {
  if (optimizer == "sgd")
    state_names_ = {"momentum"};
  else if (optimizer == "adam")
    state_names_ = {"exp_avg", "exp_avg_sq"};
  else
    throw ConfigError("Trainer: unknown optimizer '" + optimizer + "': expected sgd or adam");
  check_options(optimizer_, options_);
  kv_ = create_kvstore(kvstore);
  if (options_.zero_stage >= 1) {
    // The shards are the devices of this process, and at stage 1 the kvstore must leave the summed
    // gradient on every one of them: 'local' updates in host memory instead. Stage 2 sums with its
    // own reduce-scatter over the same devices, and takes the same. With dist_sync and
    // dist_sync_ring the shards are the ranks instead (core/optim/zero.hpp; several devices of a
    // rank are replicas), or, by shard_over, each rank's devices replicated over the ranks, or every
    // device of every rank.
    const std::string stage = std::to_string(options_.zero_stage);
    const bool processes = kv_->type() == "dist_sync" || kv_->type() == "dist_sync_ring";
    if (options_.shard_over != ShardOver::ranks && !processes)
      throw ConfigError(std::string("Trainer: shard_over ") + shard_over_name(options_.shard_over) +
                        " shards over the devices of each process of a world: it needs kvstore dist_sync or "
                        "dist_sync_ring, not kvstore '" + kv_->type() + "'");
    // Where the shards live is decided here, once; from here on the Trainer calls them the same way.
    // One engine, zero::RankShards, over a group of ranks: the dp group with a piece on the first
    // device or on every device, or this process alone (a group of one) with a piece a device, also
    // for HYBRID_SHARD, whose pieces are then all-reduced over the dp group.
    const bool devices_only = !processes || options_.shard_over == ShardOver::devices;
    if (!processes && kv_->type() != "device" && kv_->type() != "ring")
      throw ConfigError("Trainer: zero_stage " + stage + " shards the optimizer state over the devices of one process "
                        "and needs kvstore 'device' or 'ring', not '" + kv_->type() + "'");
    const dist::Group dp = options_.dp_group.value_or(dist::Group());
    if (devices_only) {
      auto devices = std::make_unique<zero::RankShards>(state_names_.size(), options_.zero_stage, options_.reduce_bucket_mb,
                                                        dist::Group::self(), true);
      if (processes) devices->replicate_over(dp);
      zero_ = std::move(devices);
    } else {
      zero_ = std::make_unique<zero::RankShards>(state_names_.size(), options_.zero_stage, options_.reduce_bucket_mb, dp,
                                                 options_.shard_over == ShardOver::all_devices);
    }
    over_ranks_ = !devices_only;
  }
  if (options_.dp_group) {
    kv_->set_group(*options_.dp_group);  // a ConfigError for a kvstore within one process
  }
  if (options_.tp_group && zero_ && !(over_ranks_ && zero_->stage() < 3))
    throw ConfigError("Trainer: a tp_group's gradient norm is built for zero_stage 0 and, over the processes, 1 and 2, "
                      "not for zero_stage " + std::to_string(options_.zero_stage) + " with kvstore '" + kv_->type() + "'");
  for (auto& [name, p] : params)
    if (p->differentiable()) params_.emplace_back(name, p);
  state_.assign(params_.size(), std::vector<std::vector<Tensor>>(state_names_.size()));
  host_state_.assign(params_.size(), std::vector<std::vector<float>>(state_names_.size()));
}

Trainer::~Trainer() = default;

const std::string& Trainer::kvstore_type() const { return kv_->type(); }

void Trainer::set_learning_rate(float lr) {
  OptimizerOptions o = options_;
  o.learning_rate = lr;
  check_options(optimizer_, o);
  options_ = o;
}

const std::vector<Tensor>& Trainer::state(const std::string& parameter, const std::string& slot) const {
  auto s = std::find(state_names_.begin(), state_names_.end(), slot);
  if (s == state_names_.end())
    throw ParameterError("Trainer.state: optimizer '" + optimizer_ + "' has no state '" + slot + "'");
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].first == parameter) return state_[k][static_cast<size_t>(s - state_names_.begin())];
  throw ParameterError("Trainer.state: '" + parameter + "' is not a trainable parameter of this trainer");
}

void Trainer::place_state(size_t k, const std::vector<Tensor>& weights) {
  MemoryTagScope tag(MemoryTag::optimizer_state);
  const Shape& shape = weights[0].shape();
  const int64_t n = numel(shape);
  for (size_t j = 0; j < state_names_.size(); ++j) {
    auto& dev = state_[k][j];
    auto& host = host_state_[k][j];
    if (!host.empty() && static_cast<int64_t>(host.size()) != n)
      throw ShapeError("Trainer: the " + state_names_[j] + " of '" + params_[k].first + "' has " +
                       std::to_string(host.size()) + " values but the parameter has shape " + str(shape));
    if (kv_->updates_on_host(weights.size())) {
      if (!dev.empty()) host = dev[0].to_vector();
      dev.clear();
      if (host.empty()) host.assign(static_cast<size_t>(n), 0.0f);
      continue;
    }
    bool placed = dev.size() == weights.size();
    for (size_t i = 0; placed && i < dev.size(); ++i) placed = dev[i].device() == weights[i].device();
    if (placed) continue;
    // First step, loaded values, or the parameter moved: copies of what there is, or zeros.
    Tensor from = !dev.empty()    ? dev[0]
                  : !host.empty() ? Tensor::from_vector(host, shape, weights[0].device())
                                  : Tensor();
    std::vector<Tensor> moved;
    for (auto& w : weights) moved.push_back(from.defined() ? from.to(w.device()) : Tensor::zeros(shape, w.device()));
    dev = std::move(moved);
    host.clear();
  }
}

void Trainer::set_buckets(const dist::BucketOptions& options) {
  if (zero_ && zero_->stage() >= 2 && options_.shard_over != ShardOver::devices && kv_->type() != "device" && kv_->type() != "ring")
    throw ConfigError("gradient buckets (--bucket-mb) all-reduce the gradients, but zero_stage " +
                      std::to_string(zero_->stage()) + " reduce-scatters them: "
                      "use zero_stage 1 with buckets");
  if (options_.shard_over == ShardOver::devices)
    throw ConfigError("gradient buckets (--bucket-mb) all-reduce whole gradients over the ranks, but shard_over devices "
                      "all-reduces each device's shard of the sum: use one or the other");
  kv_->set_buckets(options);
  std::vector<std::vector<Tensor>> weights;
  for (auto& [name, p] : params_) {
    if (!p->initialized()) return;  // a shape still deferred: built at the first step
    weights.push_back(p->list_data());
  }
  kv_->prepare(weights);
}

void Trainer::step(int64_t batch_size) { run_step(batch_size, 1.0f, false); }

bool Trainer::step_scaled(int64_t batch_size, float loss_scale) {
  if (!(std::isfinite(loss_scale) && loss_scale > 0))
    throw ConfigError("Trainer.step_scaled: loss_scale must be a finite number > 0, got " + num(loss_scale));
  return run_step(batch_size, loss_scale, true);
}

bool Trainer::run_step(int64_t batch_size, float loss_scale, bool check_finite) {
  if (batch_size <= 0) throw ConfigError("Trainer.step: batch_size must be positive, got " + std::to_string(batch_size));
  NoGrad no_grad;
  // Every parameter is checked before any is updated (the book's error for an uninitialised one).
  std::vector<std::vector<Tensor>> weights;
  for (auto& [name, p] : params_) weights.push_back(p->list_data());
  const float lr = options_.learning_rate;
  Step s = SGDStep{options_.momentum, -lr * options_.wd, -lr / static_cast<float>(batch_size)};
  if (optimizer_ == "adam") {
    AdamStep a{options_.beta1, options_.beta2, options_.epsilon, options_.wd, 1.0f / static_cast<float>(batch_size)};
    s = adam_constants(a, lr, num_update_ + 1);
  }
  // A loss scaled by loss_scale: its gradients divided by it in the step's constants (exact for a power
  // of two: the step then computes the bits of the unscaled one).
  std::visit([&](auto& step) { step.grad_scale /= loss_scale; }, s);
  // clip_grad_norm_, and a GradScaler's check: each path below hands `clip` the summed gradient's
  // squares, and steps with the grad_scale it returns, or not at all when it found an inf or a NaN.
  GradClip clipping{.max_norm = options_.clip_grad_norm, .batch_size = batch_size, .loss_scale = loss_scale};
  if (check_finite) {  // found_inf agreed over every rank this Trainer trains with
    if (kv_->type() == "dist_sync" || kv_->type() == "dist_sync_ring")
      clipping.found_inf_over.push_back(options_.dp_group.value_or(dist::Group()));
    if (options_.tp_group) clipping.found_inf_over.push_back(*options_.tp_group);
  }
  GradClip* clip = options_.clip_grad_norm > 0 || check_finite ? &clipping : nullptr;
  if (clip && options_.tp_group) {  // which parameters are slices of the tp group
    clipping.tp_group = options_.tp_group;
    for (auto& [name, p] : params_) clipping.split.push_back(p->split_over_ranks());
  }
  if (zero_) {  // ZeRO: each holder of a shard updates its shard, then all-gathers (zero_->step)
    std::vector<std::string> names;
    for (auto& [name, p] : params_) names.push_back(name);
    zero_->step({weights, names, host_state_, *kv_}, s, clip);  // skips the update on found_inf
    if (options_.clip_grad_norm > 0 && !params_.empty()) last_grad_norm_ = static_cast<float>(clip->total_norm);
    if (zero_->stage() < 3)  // stage 3's replicas are released, their gradients with them
      for (auto& [name, p] : params_) p->zero_grad();
    if (clip && clip->found_inf) return false;
    ++num_update_;
    return true;
  }
  bool summed = kv_->reduce_all(weights);  // dist_sync with buckets: every gradient summed already
  // Every key's gradients summed, then every device's parameters updated in one launch (KVStore::update_all).
  std::vector<std::vector<Tensor>> grads(params_.size());
  for (size_t k = 0; k < params_.size(); ++k) {
    for (auto& w : weights[k]) grads[k].push_back(w.grad().defined() ? w.grad() : Tensor::zeros(w.shape(), w.device()));
    place_state(k, weights[k]);
  }
  if (clip) {  // update_all sums and steps in one go: here the sums first, their norm, then the step
    for (size_t k = 0; k < params_.size() && !summed; ++k) kv_->pushpull(static_cast<int64_t>(k), grads[k]);
    summed = true;
    double split = 0, other = 0;  // every replica holds the sum; the slices of a tp_group apart
    for (size_t k = 0; k < grads.size(); ++k) (clip->is_split(k) ? split : other) += sum_of_squares(grads[k][0]);
    s = clip->apply(s, split, other);
    if (options_.clip_grad_norm > 0) last_grad_norm_ = static_cast<float>(clip->total_norm);
  }
  const bool skip = clip && clip->found_inf;  // a GradScaler's skipped step: nothing updated
  if (!skip) kv_->update_all(weights, grads, state_, host_state_, s, summed);
  for (auto& [name, p] : params_) p->zero_grad();
  if (skip) return false;
  ++num_update_;
  return true;
}

// Every parameter's replicas and name, in the Trainer's order; a parameter not yet initialized is a
// one-line ParameterError (FSDP shards what exists).
std::pair<std::vector<std::vector<Tensor>>, std::vector<std::string>> Trainer::weights_to_shard() const {
  std::vector<std::vector<Tensor>> weights;
  std::vector<std::string> names;
  for (auto& [name, p] : params_) {
    if (!p->initialized())
      throw ParameterError("FullyShardedDataParallel: parameter '" + name +
                           "' is not initialized; give the layers their input sizes or run one forward pass first");
    weights.push_back(p->list_data());
    names.push_back(name);
  }
  return {std::move(weights), std::move(names)};
}

zero::Shards& Trainer::fully_shard(const std::vector<std::vector<size_t>>& units) {
  if (!zero_ || zero_->stage() != 3)
    throw ConfigError("FullyShardedDataParallel needs a Trainer with zero_stage 3, this one has zero_stage " +
                      std::to_string(options_.zero_stage));
  auto [weights, names] = weights_to_shard();
  zero_->shard_parameters({weights, names, host_state_, *kv_}, units);
  return *zero_;
}

const zero::RankShards* Trainer::rank_shards() const { return dynamic_cast<const zero::RankShards*>(zero_.get()); }

int64_t Trainer::index_of(const Parameter& p) const {
  for (size_t k = 0; k < params_.size(); ++k)
    if (params_[k].second.get() == &p) return static_cast<int64_t>(k);
  return -1;
}

std::vector<DeviceMemory> Trainer::memory_per_device() const {
  std::vector<DeviceMemory> out;
  auto at = [&](Device d) -> DeviceMemory& {
    for (auto& m : out)
      if (m.device == d) return m;
    out.push_back(DeviceMemory{d});
    return out.back();
  };
  // A tensor's memory, none for a ZeRO-3 replica released between its uses.
  auto bytes = [](const Tensor& t) {
    return t.defined() && t.storage() ? t.numel() * static_cast<int64_t>(sizeof(float)) : 0;
  };
  for (auto& [name, p] : params_) {
    if (!p->initialized()) continue;
    for (auto& w : p->list_data()) {
      DeviceMemory& m = at(w.device());
      m.parameter_bytes += bytes(w);
      m.gradient_bytes += bytes(w.grad());
      if (!zero_ || zero_->stage() < 2) m.summed_gradient_bytes += bytes(w.grad());  // the sum, in place
    }
  }
  for (auto& slots : state_)
    for (auto& replicas : slots)
      for (auto& t : replicas) at(t.device()).state_bytes += bytes(t);
  if (zero_) zero_->add_memory(at);  // what the shards hold, measured from their tensors
  return out;
}

bool Trainer::loaded_state_waiting() const {
  if (kvstore_type() == "local") return false;  // its state lives in host memory: nothing waits
  for (auto& slots : host_state_)
    for (auto& h : slots)
      if (!h.empty()) return true;
  return false;
}

// num_update is kept as a float: exact up to 2^24 steps.
std::map<std::string, HostTensor> Trainer::state_dict() const {
  std::map<std::string, HostTensor> out;
  // zero_stage 1 or 2: the shards gathered into the unsharded layout, unless a loaded state waits.
  // Over the ranks a collective: every rank calls state_dict.
  const auto sharded = zero_ ? zero_->gather_state() : std::vector<std::vector<std::vector<float>>>{};
  for (size_t k = 0; k < params_.size(); ++k)
    for (size_t j = 0; j < state_names_.size(); ++j) {
      auto& [name, p] = params_[k];
      const auto& dev = state_[k][j];
      const auto& host = host_state_[k][j];
      HostTensor t;
      if (!dev.empty()) {
        t.shape = dev[0].shape();
        t.values = dev[0].to_vector();
      } else if (!sharded.empty() && host.empty()) {
        t.shape = p->shape();
        t.values = sharded[k][j];
      } else {
        if (!p->shape_known())
          throw ParameterError("Trainer.state_dict: parameter '" + name +
                               "' has no shape yet (deferred initialization); run a forward pass first");
        t.shape = p->shape();
        t.values = host.empty() ? std::vector<float>(static_cast<size_t>(numel(t.shape)), 0.0f) : host;
      }
      out[state_key(state_names_[j], name)] = std::move(t);
    }
  out[kNumUpdate] = HostTensor{{1}, {static_cast<float>(num_update_)}};
  out[kLearningRate] = HostTensor{{1}, {options_.learning_rate}};
  return out;
}

void Trainer::load_state_dict(const std::map<std::string, HostTensor>& state) {
  // Everything is checked before anything changes.
  std::set<std::string> expected{kNumUpdate, kLearningRate};
  for (auto& [name, p] : params_)
    for (auto& slot : state_names_) {
      const std::string key = state_key(slot, name);
      expected.insert(key);
      auto it = state.find(key);
      if (it == state.end())
        throw ParameterError("Trainer.load_state_dict: no '" + key + "' in the trainer state (parameter '" + name +
                             "' of this network, optimizer " + optimizer_ + ")");
      const HostTensor& t = it->second;
      if (static_cast<int64_t>(t.values.size()) != numel(t.shape))
        throw ShapeError("Trainer.load_state_dict: '" + key + "' has shape " + str(t.shape) + " but " +
                         std::to_string(t.values.size()) + " values");
      const Shape& ps = p->shape();  // entries <= 0: still unknown (deferred), anything fits
      bool fits = t.shape.size() == ps.size();
      for (size_t i = 0; fits && i < ps.size(); ++i) fits = ps[i] <= 0 || ps[i] == t.shape[i];
      if (!fits)
        throw ShapeError("Trainer.load_state_dict: '" + key + "' has shape " + str(t.shape) + ", parameter '" + name +
                         "' has shape " + str(ps));
    }
  for (auto& [key, t] : state)
    if (!expected.count(key))
      throw ParameterError("Trainer.load_state_dict: unexpected '" + key +
                           "' in the trainer state (not a state of optimizer " + optimizer_ +
                           " for a trainable parameter of this network)");
  const float updates = scalar_of(state, kNumUpdate), lr = scalar_of(state, kLearningRate);
  if (!(updates >= 0) || updates != std::floor(updates) || updates > 16777216.0f)
    throw ConfigError("Trainer.load_state_dict: num_update must be a whole number >= 0, got " + num(updates));
  OptimizerOptions o = options_;
  o.learning_rate = lr;
  check_options(optimizer_, o);

  for (size_t k = 0; k < params_.size(); ++k)
    for (size_t j = 0; j < state_names_.size(); ++j) {
      host_state_[k][j] = state.at(state_key(state_names_[j], params_[k].first)).values;
      state_[k][j].clear();  // placed on the replicas at the next step
    }
  num_update_ = static_cast<int64_t>(updates);
  options_ = o;
}

}  // namespace d2l::optim
