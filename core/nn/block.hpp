// Gluon-style blocks (README.md "The layer"): a Block owns named parameters
// and named children; the dotted path of a parameter (`layer1.0.bn1.running_mean`) is its name in
// collect_params() and in a safetensors file, PyTorch's state_dict key. There is no second naming
// table: the names come from register_parameter / register_child.
//
// Data parallelism is the Parameter's: initialize(init, {dev0, dev1}) makes identical replicas and
// forward(x) uses the replicas on x's device. forward_shards(xs) runs the block on the shards of one
// data-parallel batch (one shard per device) in a single call; it is the same as calling forward on
// each shard, except for blocks that look across shards (SyncBatchNorm), which override it.
// Leaf blocks override forward; blocks that hold a SyncBatchNorm somewhere below override
// forward_shards (Sequential and Residual do), so synchronisation reaches every layer.
#pragma once
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/parameter.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::nn {

using ParameterPtr = std::shared_ptr<Parameter>;

// Gluon's collect_params(): every parameter of a block and its children, in registration order
// (children in the order they were added), under its dotted name. Includes states without a
// gradient (BatchNorm's running statistics); trainable() leaves those out.
class ParameterDict {
 public:
  using Item = std::pair<std::string, ParameterPtr>;
  void add(std::string name, ParameterPtr p);
  size_t size() const { return items_.size(); }
  bool contains(const std::string& name) const;
  // The parameter of that name, or a ParameterError listing a few of the names there are.
  Parameter& operator[](const std::string& name) const;
  std::vector<Item>::const_iterator begin() const { return items_.begin(); }
  std::vector<Item>::const_iterator end() const { return items_.end(); }
  const std::vector<Item>& items() const { return items_; }
  std::vector<ParameterPtr> trainable() const;  // those with a gradient, in order

  void initialize(const Init& init, const std::vector<Device>& devices, bool force_reinit = false) const;
  void reset_ctx(const std::vector<Device>& devices) const;
  void zero_grad() const;

 private:
  std::vector<Item> items_;
};

class Block : NoCopy {
 public:
  virtual ~Block() = default;

  // One device's input -> output, with the parameters' replicas on x's device. Default:
  // forward_shards({x})[0].
  virtual Tensor forward(const Tensor& x);
  // The shards of one batch, xs[i] on device i -> outputs on the same devices. Default: forward
  // on each shard in turn.
  virtual std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs);
  Tensor operator()(const Tensor& x) { return forward(x); }
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs) { return forward_shards(xs); }

  // Every parameter under its dotted name (also renames the parameters to those paths, so their
  // errors name them: "Parameter 'features.0.weight' was not initialized on context cpu(0)").
  ParameterDict collect_params() const;
  // Gluon's net.initialize(init, ctx=[...], force_reinit): replicas on every device. Shapes that
  // depend on the input are completed at the first forward (deferred initialisation).
  void initialize(const Init& init = Init::Uniform(), const std::vector<Device>& devices = {cpu(0)},
                  bool force_reinit = false);
  // PyTorch's module.to(dev): the block's parameters (initialised or waiting for their shape)
  // live on `d` only. Model parallelism places parts of a net this way.
  Block& to(Device d);

  virtual std::string type() const = 0;       // "Conv2D", "Sequential", ...
  virtual std::string describe() const;       // one line, e.g. "Conv2D(64, kernel_size=3, stride=1)"
  std::string repr(int indent = 0) const;     // the tree, Gluon's print(net)
  const std::vector<std::pair<std::string, std::shared_ptr<Block>>>& children() const { return children_; }
  const std::vector<std::pair<std::string, ParameterPtr>>& own_params() const { return params_; }

 protected:
  Block() = default;
  // A parameter of this block under a local name ("weight"); 0 entries in `shape` are inferred at
  // the first forward.
  ParameterPtr register_parameter(const std::string& name, Shape shape, Init default_init = Init::Uniform(),
                                  bool differentiable = true);
  template <class B>
  std::shared_ptr<B> register_child(const std::string& name, std::shared_ptr<B> child) {
    add_child(name, child);
    return child;
  }
  void add_child(const std::string& name, std::shared_ptr<Block> child);

 private:
  void collect(const std::string& prefix, ParameterDict& out) const;
  std::vector<std::pair<std::string, ParameterPtr>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Block>>> children_;
};

using BlockPtr = std::shared_ptr<Block>;

}  // namespace d2l::nn
