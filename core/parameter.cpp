#include "core/parameter.hpp"

#include <algorithm>
#include <cmath>

#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/ops/op.hpp"
#include "core/runtime.hpp"
#include "kernels/cpu/kernels.hpp"

namespace d2l {

Parameter::Parameter(std::string name, Shape shape, Init default_init, bool differentiable)
    : name_(std::move(name)), shape_(std::move(shape)), init_(default_init), differentiable_(differentiable) {}

bool Parameter::shape_known() const {
  return !shape_.empty() && std::none_of(shape_.begin(), shape_.end(), [](int64_t d) { return d <= 0; });
}

void Parameter::initialize(const std::vector<Device>& devices, bool force_reinit) {
  initialize(init_, devices, force_reinit);
}

void Parameter::initialize(const Init& init, const std::vector<Device>& devices, bool force_reinit) {
  if (devices.empty()) throw ParameterError("Parameter '" + name_ + "': initialize needs at least one device");
  if ((initialized() || pending_) && !force_reinit) return;  // Gluon: already initialised, skip
  for (auto& d : devices) runtime(d);                           // unknown backends fail here, early
  init_ = init;
  devices_ = devices;
  replicas_.clear();
  pending_ = true;
  if (shape_known()) materialize();
}

void Parameter::infer_shape(const Shape& shape) {
  if (shape_known()) {
    if (shape != shape_)
      throw ParameterError("Parameter '" + name_ + "' has shape " + str(shape_) + " but the input needs " + str(shape));
    return;
  }
  if (shape.size() != shape_.size() && !shape_.empty())
    throw ParameterError("Parameter '" + name_ + "': inferred shape " + str(shape) + " does not fit " + str(shape_));
  for (size_t i = 0; i < shape_.size(); ++i)
    if (shape_[i] > 0 && shape_[i] != shape[i])
      throw ParameterError("Parameter '" + name_ + "': inferred shape " + str(shape) + " does not fit " + str(shape_));
  shape_ = shape;
  if (pending_) materialize();
}

// Every replica gets the same values: random draws use one (seed, offset) for all devices.
void Parameter::materialize() {
  NoGrad no_grad;
  int64_t n = numel(shape_);
  float a = init_.a;
  Init::Kind kind = init_.kind;
  if (kind == Init::xavier) {
    int64_t fan_out = shape_[0], fan_in = n / std::max<int64_t>(1, shape_[0]);
    int64_t rf = shape_.size() > 2 ? n / (shape_[0] * shape_[1]) : 1;  // receptive field of a conv kernel
    if (shape_.size() > 1) fan_in = shape_[1] * rf, fan_out = shape_[0] * rf;
    a = std::sqrt(6.0f / static_cast<float>(fan_in + fan_out));
    kind = Init::uniform;
  }
  uint64_t seed = current_seed(), offset = kind == Init::constant ? 0 : take_offset(static_cast<uint64_t>(n));
  replicas_.clear();
  MemoryTagScope tag(MemoryTag::parameters);
  for (auto& d : devices_) {
    Tensor t = Tensor::empty(shape_, d);
    float* X = t.data();
    launch(d, "initialize", {t.storage()}, [=](const LaunchCtx& c) {
      if (kind == Init::normal) D2L_KERNEL(c, normal, X, n, seed, offset, 0.0f, a);
      else if (kind == Init::uniform) D2L_KERNEL(c, uniform, X, n, seed, offset, -a, a);
      else D2L_KERNEL(c, fill, X, n, a);
    });
    if (differentiable_) t.attach_grad();
    t.impl().parameter = true;
    replicas_.push_back(t);
  }
  pending_ = false;
}

void Parameter::check_ready(Device d) const {
  if (pending_)
    throw ParameterError("Parameter '" + name_ +
                         "' has not been initialized yet because initialization was deferred. Actual "
                         "initialization happens during the first forward pass. Please pass one batch of data "
                         "through the network before accessing Parameters.");
  if (!initialized())
    throw ParameterError("Parameter '" + name_ + "' has not been initialized; call initialize(init, devices) first");
  if (std::find(devices_.begin(), devices_.end(), d) == devices_.end())
    throw ParameterError("Parameter '" + name_ + "' was not initialized on context " + d.str() +
                         ". It was only initialized on " + str(devices_) + ".");
}

Tensor Parameter::data(Device d) const {
  check_ready(d);
  return replicas_[std::find(devices_.begin(), devices_.end(), d) - devices_.begin()];
}

Tensor Parameter::grad(Device d) const { return data(d).grad(); }

std::vector<Tensor> Parameter::list_data() const {
  if (!devices_.empty()) check_ready(devices_[0]);
  else check_ready(cpu(0));
  return replicas_;
}

std::vector<Tensor> Parameter::list_grad() const {
  std::vector<Tensor> out;
  for (auto& t : list_data()) out.push_back(t.grad());
  return out;
}

void Parameter::zero_grad() const {
  for (auto& t : replicas_) t.zero_grad();
}

void Parameter::set_data(const Tensor& value) {
  if (value.shape() != shape_)
    throw ParameterError("Parameter '" + name_ + "': set_data with shape " + str(value.shape()) + ", expected " + str(shape_));
  for (auto& t : list_data()) value.copyto(t);
}

void Parameter::reset_ctx(const std::vector<Device>& devices) {
  if (devices.empty()) throw ParameterError("Parameter '" + name_ + "': reset_ctx needs at least one device");
  for (auto& d : devices) runtime(d);
  if (!initialized()) {
    if (!pending_) throw ParameterError("Parameter '" + name_ + "' has not been initialized; call initialize(init, devices) first");
    devices_ = devices;
    return;
  }
  NoGrad no_grad;
  MemoryTagScope tag(MemoryTag::parameters);
  Tensor source = replicas_[0];
  std::vector<Tensor> moved;
  for (auto& d : devices) {
    auto same = std::find(devices_.begin(), devices_.end(), d);
    Tensor t = same != devices_.end() ? replicas_[same - devices_.begin()] : source.to(d);
    if (differentiable_ && !t.grad().defined()) t.attach_grad();
    t.impl().parameter = true;
    moved.push_back(t);
  }
  devices_ = devices;
  replicas_ = std::move(moved);
}

}  // namespace d2l
