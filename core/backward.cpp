// The backward pass (core/backward.hpp): above the ops, whose kernels it runs to add the gradients.
#include "core/backward.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "core/allocator.hpp"
#include "core/ops.hpp"

namespace d2l {

// a + b for 16-bit gradients: added in float32 and rounded once, as a GPU adds two halves.
static Tensor add16(const Tensor& a, const Tensor& b) {
  return cast(add(cast(a, DType::f32), cast(b, DType::f32)), a.dtype());
}

// Adds one gradient into a leaf's accumulated gradient (an optimiser or zero_grad() resets it).
static void add_into_leaf(TensorImpl& leaf, const Tensor& g) {
  if (leaf.grad && leaf.dtype != DType::f32) add16(Tensor(leaf.grad), g).copyto(Tensor(leaf.grad));
  else if (leaf.grad) add_(Tensor(leaf.grad), g);
  else {
    MemoryTagScope tag(MemoryTag::gradients);
    leaf.grad = g.clone().ptr();
  }
}

void DeferWeightGrads::run(std::vector<Work>& work) {
  NoGrad no_grad;
  const std::vector<GradReadyHook> hooks = grad_ready_hooks();
  for (auto& w : work) {
    add_into_leaf(*w.leaf, w.make());
    for (auto& h : hooks) h(*w.leaf);
  }
  work.clear();
}

// Sums gradients arriving at one place. A new tensor is made rather than adding in place: a
// backward may hand the same tensor to several inputs (add passes grad_out through).
static void accumulate(Tensor& slot, const Tensor& g) {
  slot = !slot.defined() ? g : slot.dtype() == DType::f32 ? add(slot, g) : add16(slot, g);
}

void backward(const Tensor& root) {
  if (root.numel() != 1)
    throw ShapeError("backward() needs a one-element loss, got shape " + str(root.shape()) +
                     "; reduce it first (sum or mean)");
  if (!root.needs_grad()) throw std::logic_error("backward(): the loss does not depend on any tensor with a gradient");
  NoGrad no_grad;  // backward kernels are not themselves recorded

  // Reverse topological order of the nodes reachable from the root (iterative DFS, post-order).
  // `order` holds each node, so none goes away while the pass runs.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack;
  auto visit = [&](const std::shared_ptr<Node>& n) {
    if (n->released)
      throw std::logic_error("backward through " + n->name + " a second time: its saved tensors were freed by the first "
                             "backward through it; compute the loss again (PyTorch's retain_graph)");
    stack.push_back({n, 0});
    seen.insert(n.get());
  };
  if (root.impl().grad_fn) visit(root.impl().grad_fn);
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      const std::shared_ptr<Node>& child = node->inputs[next++].fn;
      if (child && !seen.count(child.get())) visit(child);
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  std::reverse(order.begin(), order.end());

  // How many edges of the graph still lead into each leaf that wants a gradient: when the last one
  // is done, the leaf's gradient for this pass is complete and the ready hooks hear of it.
  std::unordered_map<TensorImpl*, int> pending;
  for (auto& node : order)
    for (auto& in : node->inputs)
      if (in.leaf) ++pending[in.leaf.get()];
  const std::vector<GradReadyHook> hooks = grad_ready_hooks();

  std::unordered_map<Node*, Tensor> node_grad;
  std::unordered_map<TensorImpl*, Tensor> leaf_grad;
  // Gradients accumulate into the leaves (an optimiser or zero_grad() resets them).
  auto complete = [&](const std::shared_ptr<TensorImpl>& leaf) {
    auto it = leaf_grad.find(leaf.get());
    if (it != leaf_grad.end()) {
      add_into_leaf(*leaf, it->second);
      leaf_grad.erase(it);
    }
    if (DeferWeightGrads::defers(leaf.get())) return;  // its W calls the hooks
    for (auto& h : hooks) h(*leaf);
  };
  Tensor seed = Tensor::ones(root.shape(), root.device());
  if (root.impl().grad_fn) node_grad[root.impl().grad_fn.get()] = seed;
  else leaf_grad[&root.impl()] = seed, complete(root.ptr());

  for (std::shared_ptr<Node>& node : order) {
    Tensor gy = node_grad[node.get()];
    node_grad.erase(node.get());
    std::vector<Tensor> gx;
    if (gy.defined()) gx = node->backward(gy);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& in = node->inputs[i];
      if (i < gx.size() && gx[i].defined()) {
        if (gx[i].shape() != in.shape)
          throw std::logic_error("backward of " + node->name + " gave a gradient of shape " + str(gx[i].shape()) +
                                 " for an input of shape " + str(in.shape));
        if (in.fn) accumulate(node_grad[in.fn.get()], gx[i]);
        else if (in.leaf) accumulate(leaf_grad[in.leaf.get()], gx[i]);
      }
      if (in.leaf && --pending[in.leaf.get()] == 0) complete(in.leaf);
    }
    // Done with this node: free what its backward saved (activations), as PyTorch does, unless
    // another graph still leads to it (a node shared by several losses, as SyncBatchNorm's
    // statistics are by the per-device losses): then only `order` and its own output hold it.
    const long holders = 1 + (node->output.expired() ? 0 : 1);
    if (node.use_count() <= holders && !node->keeps_nothing) {
      node->backward = nullptr;
      node->inputs.clear();
      node->released = true;
    }
  }
}

Tensor& Tensor::attach_grad() {
  impl().requires_grad = true;
  impl().grad_fn = nullptr;
  MemoryTagScope tag(MemoryTag::gradients);
  impl().grad = zeros(shape(), device()).ptr();
  return *this;
}

void Tensor::zero_grad() const {
  if (impl().grad) fill_(Tensor(impl().grad), 0.0f);
}

void Tensor::backward() const { d2l::backward(*this); }

}  // namespace d2l
