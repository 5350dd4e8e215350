#include "core/autograd.hpp"

#include <algorithm>
#include <map>
#include <mutex>
#include <unordered_map>
#include <unordered_set>

#include "core/ops.hpp"

namespace d2l {

namespace debug {
std::string mutate_backward_of;
}

static std::mutex g_hooks_mu;
static std::map<int, GradReadyHook> g_hooks;
static int g_next_hook = 0;

int add_grad_ready_hook(GradReadyHook hook) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_hooks[g_next_hook] = std::move(hook);
  return g_next_hook++;
}

void remove_grad_ready_hook(int id) {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  g_hooks.erase(id);
}

static std::vector<GradReadyHook> hooks_now() {
  std::lock_guard<std::mutex> lock(g_hooks_mu);
  std::vector<GradReadyHook> out;
  for (auto& [id, h] : g_hooks) out.push_back(h);
  return out;
}

static thread_local bool g_grad_enabled = true;
static thread_local bool g_training = true;

bool grad_enabled() { return g_grad_enabled; }
NoGrad::NoGrad() : prev_(g_grad_enabled) { g_grad_enabled = false; }
NoGrad::~NoGrad() { g_grad_enabled = prev_; }

bool is_training() { return g_training; }
TrainMode::TrainMode(bool training) : prev_(g_training) { g_training = training; }
TrainMode::~TrainMode() { g_training = prev_; }

void record(const Tensor& out, const char* name, const std::vector<Tensor>& inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward) {
  if (!g_grad_enabled) return;
  bool any = std::any_of(inputs.begin(), inputs.end(), [](const Tensor& t) { return t.defined() && t.needs_grad(); });
  if (!any) return;
  auto node = std::make_shared<Node>();
  node->name = name;
  for (auto& t : inputs) node->inputs.push_back(t.ptr());
  node->backward = std::move(backward);
  out.impl().grad_fn = std::move(node);
}

// Sums gradients arriving at one place. A new tensor is made rather than adding in place: a
// backward may hand the same tensor to several inputs (add passes grad_out through).
static void accumulate(Tensor& slot, const Tensor& g) { slot = slot.defined() ? add(slot, g) : g; }

void backward(const Tensor& root) {
  if (root.numel() != 1)
    throw ShapeError("backward() needs a one-element loss, got shape " + str(root.shape()) +
                     "; reduce it first (sum or mean)");
  if (!root.needs_grad()) throw std::logic_error("backward(): the loss does not depend on any tensor with a gradient");
  NoGrad no_grad;  // backward kernels are not themselves recorded

  // Reverse topological order of the nodes reachable from the root (iterative DFS, post-order).
  std::vector<Node*> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<Node*, size_t>> stack;
  if (Node* r = root.impl().grad_fn.get()) {
    stack.push_back({r, 0});
    seen.insert(r);
  }
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (next < node->inputs.size()) {
      Node* child = node->inputs[next++]->grad_fn.get();
      if (child && seen.insert(child).second) stack.push_back({child, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  std::reverse(order.begin(), order.end());

  // How many edges of the graph still lead into each leaf that wants a gradient: when the last one
  // is done, the leaf's gradient for this pass is complete and the ready hooks hear of it.
  std::unordered_map<TensorImpl*, int> pending;
  for (Node* node : order)
    for (auto& in : node->inputs)
      if (!in->grad_fn && in->requires_grad) ++pending[in.get()];
  const std::vector<GradReadyHook> hooks = hooks_now();

  std::unordered_map<Node*, Tensor> node_grad;
  std::unordered_map<TensorImpl*, Tensor> leaf_grad;
  // Gradients accumulate into the leaves (an optimiser or zero_grad() resets them).
  auto complete = [&](const std::shared_ptr<TensorImpl>& leaf) {
    auto it = leaf_grad.find(leaf.get());
    if (it != leaf_grad.end()) {
      if (leaf->grad) add_(Tensor(leaf->grad), it->second);
      else leaf->grad = it->second.clone().ptr();
      leaf_grad.erase(it);
    }
    for (auto& h : hooks) h(*leaf);
  };
  Tensor seed = Tensor::ones(root.shape(), root.device());
  if (root.impl().grad_fn) node_grad[root.impl().grad_fn.get()] = seed;
  else leaf_grad[&root.impl()] = seed, complete(root.ptr());

  for (Node* node : order) {
    Tensor gy = node_grad[node];
    node_grad.erase(node);
    std::vector<Tensor> gx;
    if (gy.defined()) gx = node->backward(gy);
    if (!debug::mutate_backward_of.empty() && node->name == debug::mutate_backward_of && !gx.empty() &&
        gx[0].defined())
      gx[0] = scale(gx[0], 1.1f);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      auto& in = node->inputs[i];
      const bool leaf = !in->grad_fn && in->requires_grad;
      if (i < gx.size() && gx[i].defined()) {
        if (gx[i].shape() != in->shape)
          throw std::logic_error("backward of " + node->name + " gave a gradient of shape " + str(gx[i].shape()) +
                                 " for an input of shape " + str(in->shape));
        if (in->grad_fn) accumulate(node_grad[in->grad_fn.get()], gx[i]);
        else if (leaf) accumulate(leaf_grad[in.get()], gx[i]);
      }
      if (leaf && --pending[in.get()] == 0) complete(in);
    }
  }
}

}  // namespace d2l
