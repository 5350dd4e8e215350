#include "core/optim/fsdp.hpp"

#include <functional>

#include "core/autograd.hpp"

namespace d2l::optim {

FullyShardedDataParallel::FullyShardedDataParallel(std::shared_ptr<nn::Sequential> net, Trainer& trainer,
                                                   FsdpOptions options)
    : net_(std::move(net)), options_(options) {
  // The units: each block holding trainable parameters, with the Trainer's indices of its
  // parameters; a Sequential inside the net is opened, its children taken one by one (options.nested).
  unit_of_param_.assign(trainer.num_parameters(), SIZE_MAX);
  std::function<void(const nn::Sequential&)> walk = [&](const nn::Sequential& seq) {
    for (auto& [name, child] : seq.children()) {
      if (auto inner = std::dynamic_pointer_cast<nn::Sequential>(child); inner && options_.nested) {
        walk(*inner);
        continue;
      }
      std::vector<size_t> unit;
      for (auto& p : child->collect_params().trainable()) {
        const int64_t k = trainer.index_of(*p);
        if (k < 0)
          throw ConfigError("FullyShardedDataParallel: parameter '" + p->name() + "' of the net is not one of the trainer's");
        unit.push_back(static_cast<size_t>(k));
      }
      if (unit.empty()) continue;
      unit_of_block_[child.get()] = units_.size();
      for (size_t k : unit) unit_of_param_[k] = units_.size();
      units_.push_back(std::move(unit));
    }
  };
  walk(*net_);
  for (size_t k = 0; k < unit_of_param_.size(); ++k)
    if (unit_of_param_[k] == SIZE_MAX)
      throw ConfigError("FullyShardedDataParallel: the trainer's parameter " + std::to_string(k) +
                        " is not in the net it wraps");
  // Checked, now sharded: the replicas' memory goes back here.
  shards_ = &trainer.fully_shard(units_);
  const size_t devices = shards_->devices().size();
  pending_.assign(units_.size(), std::vector<size_t>(devices, 0));
  for (auto& unit : units_)
    for (size_t k : unit)
      for (size_t i = 0; i < devices; ++i)
        replica_[&shards_->replica(k, i).impl()] = {k, i};
  hook_ = add_grad_ready_hook([this](TensorImpl& leaf) { on_grad_ready(leaf); });
}

FullyShardedDataParallel::~FullyShardedDataParallel() { remove_grad_ready_hook(hook_); }

std::vector<Tensor> FullyShardedDataParallel::forward_shards(const std::vector<Tensor>& xs) {
  const std::vector<Device> devices = shards_->devices();
  bool fits = xs.size() == devices.size();
  for (size_t i = 0; fits && i < xs.size(); ++i) fits = xs[i].device() == devices[i];
  if (!fits) {
    std::vector<Device> given;
    for (auto& x : xs) given.push_back(x.device());
    throw ShapeError("FullyShardedDataParallel: one shard of the batch per device of the shards, " + str(devices) +
                     ", got shards on " + str(given));
  }
  return run(*net_, xs, grad_enabled());
}

std::vector<Tensor> FullyShardedDataParallel::run(const nn::Sequential& seq, std::vector<Tensor> ys, bool recording) {
  const std::vector<Device> devices = shards_->devices();
  auto gather_all = [&](size_t u) {
    for (size_t i = 0; i < devices.size(); ++i) shards_->gather_unit(u, i);
  };
  for (auto& [name, child] : seq.children()) {
    auto it = unit_of_block_.find(child.get());
    if (it == unit_of_block_.end()) {
      auto inner = std::dynamic_pointer_cast<nn::Sequential>(child);
      ys = inner && options_.nested ? run(*inner, ys, recording)  // its children are units
                                    : child->forward_shards(ys);  // no parameters to gather
      continue;
    }
    const size_t u = it->second;
    gather_all(u);  // nothing to do when prefetched
    if (options_.prefetch && u + 1 < units_.size())
      for (size_t i = 0; i < devices.size(); ++i) shards_->prefetch_unit(u + 1, i);
    ys = child->forward_shards(ys);
    for (size_t i = 0; i < devices.size(); ++i) {
      shards_->release_unit(u, i);
      if (!recording || !ys[i].needs_grad()) continue;
      // The pre-backward hook: an identity whose backward gathers the unit again on device i, before
      // autograd reaches the unit's own nodes.
      Tensor out = ys[i].detach();
      record(out, "fsdp_pre_backward", {ys[i]}, [this, u, i](const Tensor& g) {
        pre_backward(u, i);
        return std::vector<Tensor>{g};
      });
      ys[i] = out;
    }
  }
  return ys;
}

void FullyShardedDataParallel::pre_backward(size_t u, size_t i) {
  shards_->gather_unit(u, i);
  pending_[u][i] = units_[u].size();
  if (options_.prefetch && u > 0) shards_->prefetch_unit(u - 1, i);  // the unit backward reaches next
}

void FullyShardedDataParallel::on_grad_ready(TensorImpl& leaf) {
  auto it = replica_.find(&leaf);
  if (it == replica_.end()) return;  // another net's parameter
  const auto [k, i] = it->second;
  shards_->add_gradient(k, i);  // over the devices: into the shards now; over the ranks: nothing yet
  const size_t u = unit_of_param_[k];
  if (pending_[u][i] > 0 && --pending_[u][i] == 0) {
    shards_->unit_gradients_done(u, i);  // over the ranks: the whole unit reduce-scattered in one collective
    shards_->release_unit(u, i);
  }
}

FullyShardedDataParallel::FullParameters::FullParameters(FullyShardedDataParallel& f) : f_(f) {
  for (size_t u = 0; u < f_.units_.size(); ++u)
    for (size_t i = 0; i < f_.shards_->devices().size(); ++i) f_.shards_->gather_unit(u, i);
}

FullyShardedDataParallel::FullParameters::~FullParameters() {
  for (size_t u = 0; u < f_.units_.size(); ++u)
    for (size_t i = 0; i < f_.shards_->devices().size(); ++i) f_.shards_->release_unit(u, i);
}

}  // namespace d2l::optim
