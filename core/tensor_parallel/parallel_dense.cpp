#include "core/tensor_parallel/parallel_dense.hpp"

#include "core/ops.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"

namespace d2l::tp {

namespace {

// The group must divide the dimension it splits; `over` names the group ("2 devices [cpu(0), cpu(1)]").
void check_divides(const char* who, const char* what, int64_t n, int64_t P, const std::string& over) {
  if (n < 1 || n % P != 0)
    throw ConfigError(std::string(who) + ": " + what + " " + std::to_string(n) + " cannot be split evenly over " + over +
                      " (needs a positive multiple of " + std::to_string(P) + ")");
}
std::string over_devices(const std::vector<Device>& devices) {
  return std::to_string(devices.size()) + " devices " + str(devices);
}
std::string over_ranks(const dist::Group& group) { return std::to_string(group.size()) + " ranks " + group.str(); }

// Where the shards are, for describe(): "[cpu(0), cpu(1)]", or "ranks [0, 1] (this rank's shard 1 on cpu(0))".
std::string placement(const std::optional<dist::Group>& group, const std::vector<Device>& devices) {
  if (!group) return str(devices);
  return "ranks " + group->str() + " (this rank's shard " + std::to_string(group->rank()) + " on " + devices[0].str() + ")";
}

// f and g on this process's shards: over its devices, or over the ranks of its process group.
std::vector<Tensor> f_of(const std::optional<dist::Group>& group, const std::vector<Tensor>& xs) {
  if (group) return {copy_to_parallel_region(xs[0], *group)};
  return copy_to_parallel_region(xs);
}
std::vector<Tensor> g_of(const std::optional<dist::Group>& group, const std::vector<Tensor>& zs) {
  if (group) return {reduce_from_parallel_region(zs[0], *group)};
  return reduce_from_parallel_region(zs);
}

// One input per device of the group, in the group's order.
void check_inputs(const nn::Block& b, const std::vector<Device>& devices, const std::vector<Tensor>& xs) {
  bool ok = xs.size() == devices.size();
  for (size_t i = 0; ok && i < xs.size(); ++i) ok = xs[i].device() == devices[i];
  if (ok) return;
  std::vector<Device> got;
  for (auto& x : xs) got.push_back(x.device());
  throw ShapeError(b.type() + ": takes one input per device of its group " + str(devices) + ", in that order, got " +
                   str(got));
}

}  // namespace

ColumnParallelDense::ColumnParallelDense(int64_t units, const std::vector<Device>& devices,
                                         const std::string& activation, bool use_bias, int64_t in_units)
    : units_(units), devices_(devices) {
  check_group("ColumnParallelDense", devices);
  check_divides("ColumnParallelDense", "units", units, static_cast<int64_t>(devices.size()), over_devices(devices));
  const int64_t per_device = units / static_cast<int64_t>(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    auto shard = std::make_shared<nn::Dense>(per_device, activation, use_bias, in_units);
    register_child(std::to_string(i), shard)->to(devices[i]);
    shards_.push_back(shard);
  }
}

ColumnParallelDense::ColumnParallelDense(int64_t units, const dist::Group& group, Device device,
                                         const std::string& activation, bool use_bias, int64_t in_units)
    : units_(units), devices_{device}, group_(group) {
  check_divides("ColumnParallelDense", "units", units, group.size(), over_ranks(group));
  auto shard = std::make_shared<nn::Dense>(units / group.size(), activation, use_bias, in_units);
  register_child(std::to_string(group.rank()), shard)->to(device);
  shards_.push_back(shard);
  for (auto& [name, p] : shard->collect_params()) p->mark_split_over_ranks();
}

std::vector<Tensor> ColumnParallelDense::forward_shards(const std::vector<Tensor>& xs) {
  check_inputs(*this, devices_, xs);
  std::vector<Tensor> ys = f_of(group_, xs);  // f
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = shards_[i]->forward(ys[i]);
  return ys;
}

std::string ColumnParallelDense::describe() const {
  const int64_t in = shards_[0]->weight->shape()[1];
  const std::string act = shards_[0]->activation();
  return "ColumnParallelDense(" + (in > 0 ? std::to_string(in) : std::string("None")) + " -> " +
         std::to_string(units_) + " over " + placement(group_, devices_) + ", " + (act.empty() ? "linear" : "Activation(" + act + ")") +
         ")";
}

RowParallelDense::RowParallelDense(int64_t units, int64_t in_units, const std::vector<Device>& devices, bool use_bias)
    : units_(units), in_units_(in_units), devices_(devices) {
  check_group("RowParallelDense", devices);
  if (units < 1) throw ConfigError("RowParallelDense: units must be >= 1, got " + std::to_string(units));
  check_divides("RowParallelDense", "in_units", in_units, static_cast<int64_t>(devices.size()), over_devices(devices));
  const int64_t per_device = in_units / static_cast<int64_t>(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    auto shard = std::make_shared<nn::Dense>(units, "", false, per_device);
    register_child(std::to_string(i), shard)->to(devices[i]);
    shards_.push_back(shard);
  }
  if (use_bias) {
    bias = register_parameter("bias", {units}, Init::Zero());
    bias->initialize(devices);
  }
}

RowParallelDense::RowParallelDense(int64_t units, int64_t in_units, const dist::Group& group, Device device,
                                   bool use_bias)
    : units_(units), in_units_(in_units), devices_{device}, group_(group) {
  if (units < 1) throw ConfigError("RowParallelDense: units must be >= 1, got " + std::to_string(units));
  check_divides("RowParallelDense", "in_units", in_units, group.size(), over_ranks(group));
  auto shard = std::make_shared<nn::Dense>(units, "", false, in_units / group.size());
  register_child(std::to_string(group.rank()), shard)->to(device);
  shards_.push_back(shard);
  for (auto& [name, p] : shard->collect_params()) p->mark_split_over_ranks();  // the bias below is whole on every rank
  if (use_bias) {
    bias = register_parameter("bias", {units}, Init::Zero());
    bias->initialize(devices_);
  }
}

std::vector<Tensor> RowParallelDense::forward_shards(const std::vector<Tensor>& xs) {
  check_inputs(*this, devices_, xs);
  std::vector<Tensor> partial;
  for (size_t i = 0; i < xs.size(); ++i) partial.push_back(shards_[i]->forward(xs[i]));
  std::vector<Tensor> ys = g_of(group_, partial);  // g
  if (bias)
    for (size_t i = 0; i < ys.size(); ++i) ys[i] = bias_add(ys[i], bias->data(devices_[i]));
  return ys;
}

std::string RowParallelDense::describe() const {
  return "RowParallelDense(" + std::to_string(in_units_) + " -> " + std::to_string(units_) + " over " + placement(group_, devices_) + ")";
}

}  // namespace d2l::tp
