#include "core/optim/kvstore.hpp"

#include <algorithm>
#include <cmath>
#include <optional>

#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"

namespace d2l::optim {

void sgd_step(const Tensor& w, const Tensor& mom, const Tensor& g, const SGDStep& s) {
  scale_(mom, s.momentum);      // mom = momentum * mom
  add_(mom, w, s.decay);        //     - lr * wd * w
  add_(mom, g, s.grad_scale);   //     - (lr / batch_size) * g
  add_(w, mom, 1.0f);           // w = w + mom
}

void sgd_step(float* w, float* mom, const float* g, int64_t n, const SGDStep& s) {
  for (int64_t i = 0; i < n; ++i) {  // each line rounds to float, as each kernel above stores floats
    mom[i] = s.momentum * mom[i];
    mom[i] += s.decay * w[i];
    mom[i] += s.grad_scale * g[i];
    w[i] += 1.0f * mom[i];
  }
}

AdamStep adam_constants(AdamStep s, float lr, int64_t t) {
  const double k = static_cast<double>(t);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(static_cast<double>(s.beta1), k)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(s.beta2), k)));
  return s;
}

void adam_step(const Tensor& w, const Tensor& m, const Tensor& v, const Tensor& g, const AdamStep& s) {
  adam_update_(w, m, v, g, s);
}

void adam_step(float* w, float* m, float* v, const float* g, int64_t n, const AdamStep& s) {
  for (int64_t i = 0; i < n; ++i) {  // PyTorch's Adam, as kernels/cpu/adam.cpp writes it (core/ops.hpp)
    const float gi = s.grad_scale * g[i] + s.wd * w[i];
    m[i] = s.beta1 * m[i] + (1.0f - s.beta1) * gi;
    v[i] = s.beta2 * v[i] + (1.0f - s.beta2) * gi * gi;
    w[i] -= s.step_size * (m[i] / (std::sqrt(v[i]) / s.bias_correction2_sqrt + s.epsilon));
  }
}

size_t state_slots(const Step& s) { return std::holds_alternative<SGDStep>(s) ? 1 : 2; }

void step_on_device(const Tensor& w, const std::vector<Tensor>& state, const Tensor& g, const Step& s) {
  if (auto* sgd = std::get_if<SGDStep>(&s))
    sgd_step(w, state[0], g, *sgd);
  else
    adam_step(w, state[0], state[1], g, std::get<AdamStep>(s));
}

void step_on_devices(const std::vector<ReplicaStep>& replicas, const Step& s) {
  std::vector<Device> devices;  // in order of first appearance
  for (const ReplicaStep& r : replicas)
    if (std::find(devices.begin(), devices.end(), r.w.device()) == devices.end()) devices.push_back(r.w.device());
  for (Device d : devices) {
    std::vector<const ReplicaStep*> here;
    for (const ReplicaStep& r : replicas)
      if (r.w.device() == d) here.push_back(&r);
    if (here.size() == 1) {  // the plain per-tensor step
      step_on_device(here[0]->w, here[0]->state, here[0]->g, s);
      continue;
    }
    // list j of the launch: slot j of every replica here (w, g: the weights and gradients)
    auto list = [&](auto field) {
      std::vector<Tensor> out;
      for (const ReplicaStep* r : here) out.push_back(field(*r));
      return out;
    };
    const auto w = list([](const ReplicaStep& r) { return r.w; });
    const auto g = list([](const ReplicaStep& r) { return r.g; });
    const auto slot0 = list([](const ReplicaStep& r) { return r.state[0]; });
    if (auto* sgd = std::get_if<SGDStep>(&s)) {
      multi_sgd_mom_update_(w, slot0, g, sgd->momentum, sgd->decay, sgd->grad_scale);
    } else {
      const auto slot1 = list([](const ReplicaStep& r) { return r.state[1]; });
      multi_adam_update_(w, slot0, slot1, g, std::get<AdamStep>(s));
    }
  }
}

Step GradClip::apply(const Step& s, double squares) {
  found_inf = !std::isfinite(squares);
  for (const dist::Group& g : found_inf_over)
    if (g.size() > 1) found_inf = dist::sum_over_ranks({found_inf ? 1.0 : 0.0}, g)[0] > 0;
  total_norm = std::sqrt(squares) / static_cast<double>(batch_size) / static_cast<double>(loss_scale);
  if (found_inf || max_norm <= 0) return s;
  const double coef = static_cast<double>(max_norm) / (total_norm + 1e-6);
  if (coef >= 1) return s;  // clip_grad_norm_ clamps the coefficient at 1
  Step out = s;
  std::visit([&](auto& step) { step.grad_scale *= static_cast<float>(coef); }, out);
  return out;
}

Step GradClip::apply(const Step& s, double split_squares, double other_squares) {
  if (tp_group && tp_group->size() > 1) split_squares = dist::sum_over_ranks({split_squares}, *tp_group)[0];
  return apply(s, split_squares + other_squares);
}

double sum_of_squares(const Tensor& t) {
  double out = 0;
  if (t.numel() == 0) return out;
  for (float v : t.to_vector()) out += static_cast<double>(v) * static_cast<double>(v);
  return out;
}

namespace {

// Step s on host arrays of n floats; state: its slots.
void step_on_host(float* w, std::vector<std::vector<float>>& state, const float* g, int64_t n, const Step& s) {
  if (auto* sgd = std::get_if<SGDStep>(&s))
    sgd_step(w, state[0].data(), g, n, *sgd);
  else
    adam_step(w, state[0].data(), state[1].data(), g, n, std::get<AdamStep>(s));
}

// One key's values: float32, one shape, one per device.
void check_values(const char* what, const std::vector<Tensor>& values) {
  if (values.empty()) throw ShapeError(std::string("kvstore: no ") + what + " to reduce");
  for (size_t i = 0; i < values.size(); ++i) {
    if (values[i].dtype() != DType::f32 || values[i].shape() != values[0].shape())
      throw ShapeError(std::string("kvstore: every replica's ") + what + " must be float32 " + str(values[0].shape()) +
                       ", got " + str(values[i].shape()) + " on " + values[i].device().str());
    for (size_t j = 0; j < i; ++j)
      if (values[j].device() == values[i].device())
        throw ShapeError(std::string("kvstore: two ") + what + " on " + values[i].device().str());
  }
}

size_t bytes_of(const Tensor& t) { return static_cast<size_t>(t.numel()) * sizeof(float); }

// Replicas on devices of one kind run the same kernels on the same bits, so updating each in place
// keeps them equal: their steps are added to `batch`, for step_on_devices. Across kinds (a real GPU's
// fused multiply-add beside a CPU loop) the results could differ in the last bit, so replica `home`
// updates now and the others receive its bits (weights and state). state[j][i]: slot j on replica i.
void update_replicas(const std::vector<Tensor>& w, const std::vector<Tensor>& g,
                     const std::vector<std::vector<Tensor>>& state, const Step& s, size_t home,
                     std::vector<ReplicaStep>& batch) {
  auto slots_of = [&](size_t i) {
    std::vector<Tensor> out;
    for (auto& slot : state) out.push_back(slot[i]);
    return out;
  };
  bool one_kind = std::all_of(w.begin(), w.end(), [&](const Tensor& t) { return t.device().kind == w[0].device().kind; });
  if (one_kind) {
    for (size_t i = 0; i < w.size(); ++i) batch.push_back(ReplicaStep{w[i], slots_of(i), g[i]});
    return;
  }
  step_on_device(w[home], slots_of(home), g[home], s);
  for (size_t i = 0; i < w.size(); ++i) {
    if (i == home) continue;
    w[home].copyto(w[i]);
    for (auto& slot : state) slot[home].copyto(slot[i]);
  }
}

// The sum of the replicas in host memory, added in replica order.
std::vector<float> host_sum(const std::vector<Tensor>& values) {
  const size_t n = static_cast<size_t>(values[0].numel());
  std::vector<float> sum(n), part(n);
  copy_to_host(values[0], sum.data(), bytes_of(values[0]));
  for (size_t i = 1; i < values.size(); ++i) {
    copy_to_host(values[i], part.data(), bytes_of(values[i]));
    for (size_t j = 0; j < n; ++j) sum[j] += part[j];
  }
  return sum;
}

class DeviceKVStore : public KVStore {
 public:
  explicit DeviceKVStore(std::string type = "device") : KVStore(std::move(type)) {}

  // The reducing device r gathers the others' values and adds them in replica order (a copy of
  // replica 0 first), so the sum has the same bits whichever device reduces; then it is copied back.
  void pushpull(int64_t key, const std::vector<Tensor>& values) override {
    check_values("values", values);
    if (values.size() < 2) return;
    NoGrad no_grad;
    const size_t r = reducer(key, values);
    const Device dr = values[r].device();
    Tensor acc = r == 0 ? values[0] : values[0].to(dr);
    for (size_t i = 1; i < values.size(); ++i) add_(acc, i == r ? values[r] : values[i].to(dr));
    for (auto& v : values)
      if (!acc.same(v)) acc.copyto(v);
  }

  std::map<int64_t, Device> placement() const override { return placement_; }

 protected:
  size_t home(int64_t key, const std::vector<Tensor>& values) const override {
    auto it = placement_.find(key);
    for (size_t i = 0; it != placement_.end() && i < values.size(); ++i)
      if (values[i].device() == it->second) return i;
    return 0;
  }

 private:
  // A key keeps its device while its replicas stay there. A new key goes to the device among its
  // replicas with the fewest elements assigned so far (first in the list on a tie): MXNet's
  // CommDevice balances keys by size the same way.
  size_t reducer(int64_t key, const std::vector<Tensor>& values) {
    auto it = placement_.find(key);
    if (it != placement_.end()) {
      for (size_t i = 0; i < values.size(); ++i)
        if (values[i].device() == it->second) return i;
      load_[it->second] -= values[0].numel();  // the parameter moved (reset_ctx): place it again
    }
    size_t best = 0;
    for (size_t i = 1; i < values.size(); ++i)
      if (load_[values[i].device()] < load_[values[best].device()]) best = i;
    load_[values[best].device()] += values[0].numel();
    placement_[key] = values[best].device();
    return best;
  }

  std::map<int64_t, Device> placement_;
  std::map<Device, int64_t> load_;  // elements reduced per device, over all keys
};

// MXNet's dist_sync: the replicas of this process are summed on a device as 'device' does, that
// sum crosses the processes (dist::allreduce), and the result is copied back to the replicas; each
// replica then updates itself. Every process ends with the same bits (the allreduce gives each rank
// the same sum), so the replicas of every process stay equal without sending weights.
class DistSyncKVStore : public DeviceKVStore {
 public:
  explicit DistSyncKVStore(std::string algorithm)
      : DeviceKVStore(algorithm == "ring" ? "dist_sync_ring" : "dist_sync"), algorithm_(std::move(algorithm)) {
    dist::check_algorithm("kvstore dist_sync algorithm", algorithm_);
    dist::init();
  }

  void pushpull(int64_t key, const std::vector<Tensor>& values) override {
    DeviceKVStore::pushpull(key, values);  // every replica holds this process's sum
    if (group_.size() == 1) return;
    NoGrad no_grad;
    const size_t h = home(key, values);
    dist::allreduce(values[h], group_, algorithm_);
    for (size_t i = 0; i < values.size(); ++i)
      if (i != h) values[h].copyto(values[i]);
  }

  void set_buckets(const dist::BucketOptions& options) override {
    bucket_options_ = options;
    bucket_options_->algorithm = algorithm_;
    dist::check_algorithm("kvstore dist_sync algorithm", algorithm_);
    if (!(options.bucket_mb >= 0)) throw ConfigError("bad --bucket-mb: must be >= 0 (0: one bucket per parameter)");
    if (!group_.is_world())
      throw ConfigError("kvstore " + type() + ": gradient buckets sum over the world, not over the group " + group_.str());
    buckets_.reset();
  }
  void set_group(const dist::Group& group) override {
    if (bucket_options_ && !group.is_world())
      throw ConfigError("kvstore " + type() + ": gradient buckets sum over the world, not over the group " + group.str());
    group_ = group;
  }

  // The buckets are built by prepare (Trainer::set_buckets, the shapes known) or else at the first
  // step, which then reduces everything after backward; afterwards they launch during backward.
  void prepare(const std::vector<std::vector<Tensor>>& weights) override {
    if (bucket_options_ && (!buckets_ || !buckets_->same_replicas(weights)))
      buckets_ = std::make_unique<dist::Buckets>(weights, *bucket_options_);
  }
  bool reduce_all(const std::vector<std::vector<Tensor>>& weights) override {
    if (!bucket_options_) return false;
    prepare(weights);
    buckets_->finish();
    return true;
  }

 private:
  std::string algorithm_;
  dist::Group group_;  // the ranks summed over
  std::optional<dist::BucketOptions> bucket_options_;
  std::unique_ptr<dist::Buckets> buckets_;
};

class LocalKVStore : public KVStore {
 public:
  LocalKVStore() : KVStore("local") {}

  void pushpull(int64_t, const std::vector<Tensor>& values) override {
    check_values("values", values);
    if (values.size() < 2) return;
    std::vector<float> sum = host_sum(values);
    for (auto& v : values) copy_from_host(sum.data(), bytes_of(v), v);
  }

  bool updates_on_host(size_t replicas) const override { return replicas >= 2; }

  // The weights are read from replica 0 every step (not cached), so values set on the parameter
  // between steps (a loaded checkpoint) are what gets updated.
  void update(int64_t key, const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
              const std::vector<std::vector<Tensor>>& state, std::vector<std::vector<float>>& host_state,
              const Step& s, bool summed) override {
    if (!updates_on_host(weights.size())) return KVStore::update(key, weights, grads, state, host_state, s, summed);
    check_values("gradients", grads);
    check_values("weights", weights);
    const int64_t n = weights[0].numel();
    bool fits = grads[0].shape() == weights[0].shape() && host_state.size() == state_slots(s);
    for (auto& slot : host_state) fits = fits && static_cast<int64_t>(slot.size()) == n;
    if (!fits)
      throw ShapeError("kvstore 'local': weights " + str(weights[0].shape()) + ", gradients " + str(grads[0].shape()) +
                       " and the optimizer state (" + std::to_string(host_state.size()) + " slots of " +
                       std::to_string(host_state.empty() ? 0 : host_state[0].size()) + ") do not match");
    std::vector<float> g = summed ? grads[0].to_vector() : host_sum(grads), w(static_cast<size_t>(n));
    copy_to_host(weights[0], w.data(), bytes_of(weights[0]));
    step_on_host(w.data(), host_state, g.data(), n, s);
    for (auto& t : weights) copy_from_host(w.data(), bytes_of(t), t);
  }
};

// MXNet's kvstore=None: nothing is summed over the replicas, each is updated from its own gradient.
// For tensors whose every replica already holds the whole gradient: tensor parallelism's replicated
// layers and the row-parallel layer's bias (core/tensor_parallel), where a sum would count it P times.
class NoneKVStore : public KVStore {
 public:
  NoneKVStore() : KVStore("none") {}
  void pushpull(int64_t, const std::vector<Tensor>& values) override { check_values("values", values); }
};

class RingKVStore : public KVStore {
 public:
  RingKVStore() : KVStore("ring") {}
  void pushpull(int64_t, const std::vector<Tensor>& values) override {
    check_values("values", values);
    NoGrad no_grad;
    allreduce_ring(values);
  }
};

}  // namespace

void KVStore::set_buckets(const dist::BucketOptions&) {
  throw ConfigError("gradient buckets (--bucket-mb) need kvstore dist_sync or dist_sync_ring, not '" + type() + "'");
}

void KVStore::set_group(const dist::Group&) {
  throw ConfigError("a process group to sum over needs kvstore dist_sync or dist_sync_ring, not '" + type() + "'");
}

namespace {

// update()'s arguments fit: as many gradients and state tensors per slot as weights, state_slots(s) slots.
void check_update(const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
                  const std::vector<std::vector<Tensor>>& state, const Step& s) {
  check_values("weights", weights);
  bool fits = grads.size() == weights.size() && state.size() == state_slots(s);
  for (auto& slot : state) fits = fits && slot.size() == weights.size();
  if (!fits)
    throw ShapeError("kvstore: " + std::to_string(weights.size()) + " weights but " + std::to_string(grads.size()) +
                     " gradients and " + std::to_string(state.size()) + " state slots of " +
                     std::to_string(state.empty() ? 0 : state[0].size()) + " tensors (the optimizer needs " +
                     std::to_string(state_slots(s)) + " slots)");
}

}  // namespace

void KVStore::update(int64_t key, const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
                     const std::vector<std::vector<Tensor>>& state, std::vector<std::vector<float>>& host_state,
                     const Step& s, bool summed) {
  (void)host_state;
  check_update(weights, grads, state, s);
  NoGrad no_grad;
  if (!summed) pushpull(key, grads);
  std::vector<ReplicaStep> batch;
  update_replicas(weights, grads, state, s, home(key, grads), batch);
  step_on_devices(batch, s);
}

void KVStore::update_all(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& grads,
                         const std::vector<std::vector<std::vector<Tensor>>>& state,
                         std::vector<std::vector<std::vector<float>>>& host_state, const Step& s, bool summed) {
  NoGrad no_grad;
  std::vector<ReplicaStep> batch;  // every key's replicas that update themselves, stepped together below
  for (size_t k = 0; k < weights.size(); ++k) {
    const auto key = static_cast<int64_t>(k);
    if (updates_on_host(weights[k].size())) {
      update(key, weights[k], grads[k], state[k], host_state[k], s, summed);
      continue;
    }
    check_update(weights[k], grads[k], state[k], s);
    if (!summed) pushpull(key, grads[k]);
    update_replicas(weights[k], grads[k], state[k], s, home(key, grads[k]), batch);
  }
  step_on_devices(batch, s);
}

std::unique_ptr<KVStore> create_kvstore(const std::string& name) {
  if (name == "device") return std::make_unique<DeviceKVStore>();
  if (name == "local") return std::make_unique<LocalKVStore>();
  if (name == "ring") return std::make_unique<RingKVStore>();
  if (name == "none") return std::make_unique<NoneKVStore>();
  if (name == "dist_sync") return std::make_unique<DistSyncKVStore>("library");
  if (name == "dist_sync_ring") return std::make_unique<DistSyncKVStore>("ring");
  if (name == "nccl")
    throw ConfigError("kvstore 'nccl' needs GPUs and a build with NCCL, and this build has no NCCL; use 'device', "
                      "'local', 'ring' or 'dist_sync'");
  throw ConfigError("unknown kvstore '" + name + "': expected device, local, ring, dist_sync, dist_sync_ring, nccl or none");
}

void broadcast_parameters(const nn::ParameterDict& params, int root, bool states_only) {
  NoGrad no_grad;
  std::vector<Tensor> all;
  for (auto& [name, p] : params) {
    if (states_only && p->differentiable()) continue;
    std::vector<Tensor> replicas = p->list_data();
    dist::broadcast(replicas[0], root);
    for (size_t i = 1; i < replicas.size(); ++i) replicas[0].copyto(replicas[i]);
    all.insert(all.end(), replicas.begin(), replicas.end());
  }
  dist::check_same_bits(all, states_only ? "BatchNorm statistics" : "parameters");
}

}  // namespace d2l::optim
