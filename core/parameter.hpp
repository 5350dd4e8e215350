// Gluon-style parameters (README.md "The layer"): a Parameter is a replica set, one tensor and gradient per
// device it was initialised on. initialize(init, devices) makes identical replicas (the same
// counter-based random numbers on every device); a forward pass uses the replica on the input's
// device. A shape with a 0 is unknown until the first forward (deferred initialisation).
#pragma once
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

struct Init {
  enum Kind { normal, uniform, constant, xavier } kind = uniform;
  float a = 0.07f, b = 0.0f;  // normal: sigma; uniform: scale (U(-a, a)); constant: value
  static Init Normal(float sigma = 0.01f) { return {normal, sigma, 0}; }
  static Init Uniform(float scale = 0.07f) { return {uniform, scale, 0}; }  // Gluon's default
  static Init Constant(float v) { return {constant, v, 0}; }
  static Init Zero() { return {constant, 0, 0}; }
  static Init One() { return {constant, 1, 0}; }
  static Init Xavier() { return {xavier, 0, 0}; }  // uniform, scale sqrt(6 / (fan_in + fan_out))
};

// Misuse of a parameter (uninitialised, wrong device, deferred): the book's clear errors.
struct ParameterError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

class Parameter {
 public:
  // differentiable = false: a state without a gradient (BatchNorm's running statistics; Gluon's
  // grad_req 'null'); a Trainer leaves it alone, a checkpoint saves it.
  Parameter(std::string name, Shape shape, Init default_init = Init::Uniform(), bool differentiable = true);

  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }  // blocks give it its dotted path
  bool differentiable() const { return differentiable_; }
  // A slice of a layer split over the ranks of a tensor-parallel process group (core/tensor_parallel;
  // Megatron-LM's tensor_model_parallel attribute): each rank of the group holds a different part.
  // A gradient norm adds such slices over the group and counts every other parameter once
  // (OptimizerOptions::tp_group, core/optim/trainer.hpp).
  bool split_over_ranks() const { return split_over_ranks_; }
  void mark_split_over_ranks() { split_over_ranks_ = true; }
  const Init& default_init() const { return init_; }
  const Shape& shape() const { return shape_; }
  bool shape_known() const;

  // Makes one replica per device (identical values). With an unknown shape the work waits for
  // infer_shape(). Re-initialising needs force_reinit (Gluon warns and skips otherwise).
  void initialize(const std::vector<Device>& devices, bool force_reinit = false);
  void initialize(const Init& init, const std::vector<Device>& devices, bool force_reinit = false);
  // Completes a deferred shape (0 entries) from the first input; checks known entries agree.
  void infer_shape(const Shape& shape);

  Tensor data(Device d) const;  // the replica on d, or the book's error
  Tensor data() const { return data(cpu(0)); }  // Gluon's default context
  Tensor grad(Device d) const;
  std::vector<Tensor> list_data() const;
  std::vector<Tensor> list_grad() const;
  const std::vector<Device>& list_ctx() const { return devices_; }
  bool initialized() const { return !replicas_.empty(); }
  bool deferred() const { return pending_ && replicas_.empty(); }  // initialize() called, shape unknown
  void zero_grad() const;
  // Sets every replica to `value` (e.g. loaded weights); shape must match.
  void set_data(const Tensor& value);
  // Gluon's reset_ctx: the same values, now on `devices` (copied from the first replica); a
  // parameter still waiting for its shape just changes where it will be made.
  void reset_ctx(const std::vector<Device>& devices);

 private:
  void materialize();
  void check_ready(Device d) const;
  std::string name_;
  Shape shape_;
  Init init_;
  std::vector<Device> devices_;
  std::vector<Tensor> replicas_;
  bool pending_ = false;  // initialize() called, shape still unknown
  bool differentiable_ = true;
  bool split_over_ranks_ = false;
};

}  // namespace d2l
