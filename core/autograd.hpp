// Graph autograd (README.md "Decisions": autograd frees as it goes). Each result of a differentiable op
// made while recording is on knows its Node: the op's name, its inputs and its backward. This file is
// the graph the ops record into, below them; backward() (core/backward.hpp), above the ops, walks it
// from a scalar in reverse topological order; each backward enqueues its kernels on the device where
// that node's tensors live, so per-device losses run their backward in parallel.
#pragma once
#include <functional>
#include <memory>
#include <unordered_set>
#include <string>
#include <vector>

#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l {

struct Node;
// An edge from a node to one input of its op. It holds what backward needs to reach and never the
// input's memory: an activation lives only as long as some backward closure saves it (as PyTorch's
// graph edges point at grad_fn nodes, not at tensors).
struct Edge {
  std::shared_ptr<Node> fn;          // the input's own node, when the input is a result of an op
  std::shared_ptr<TensorImpl> leaf;  // the input itself, when it is a leaf that wants a gradient
  Shape shape;                       // the input's shape (its gradient must have it)
};

struct Node {
  std::string name;                                   // op name, e.g. "matmul"
  std::vector<Edge> inputs;                           // one per input of the op, in order
  // Given d(loss)/d(output), returns d(loss)/d(input) per input (undefined = no gradient).
  std::function<std::vector<Tensor>(const Tensor& grad_out)> backward;
  // After a backward pass through it no other graph reaches, its saved tensors and edges are freed.
  bool released = false;
  // Its backward keeps no tensor (a cast's: only the type to cast back to), so a graph built later on
  // its output, while that output lives, may pass through it again: never released. Autocast's one
  // copy of a weight, read by several micro-batches' graphs, each with its own backward, is one.
  bool keeps_nothing = false;
  std::weak_ptr<TensorImpl> output;  // the result it made (whose grad_fn it is), while that lives
};

// A flag of this thread set for a scope and put back as it was when the scope ends: the modes below.
class FlagScope : NoCopy {
 public:
  FlagScope(bool& flag, bool value) : flag_(flag), prev_(flag) { flag = value; }
  ~FlagScope() { flag_ = prev_; }

 private:
  bool& flag_;
  bool prev_;
};

// Whether ops record graph nodes (on by default). The book's autograd.record() is the default here;
// NoGrad turns it off for evaluation and parameter updates.
bool grad_enabled();
struct NoGrad : FlagScope {
  NoGrad();
};

// Training / evaluation mode, separate from NoGrad: BatchNorm uses batch statistics in training.
bool is_training();
struct TrainMode : FlagScope {  // scope: TrainMode t(false) evaluates
  explicit TrainMode(bool training);
};

// Activation recomputation (core/pipeline's checkpointing): inside a Recompute scope a forward is a
// second run of one already made, so BatchNorm leaves its running statistics alone.
bool is_recomputing();
struct Recompute : FlagScope {
  Recompute();
};

// Zero-bubble pipelines (core/pipeline's zb-h1) split a backward into B, the input gradients, and W,
// the weight gradients. While a DeferWeightGrads scope is alive on this thread, ops whose weight
// gradient is a kernel of its own (conv2d's backward_weight, matmul's) leave the gradient of a leaf
// out of backward and keep its work here; run() later enqueues that work and adds each gradient
// into its leaf, and then calls the gradient-ready hooks (below) for it.
class DeferWeightGrads : NoCopy {
 public:
  DeferWeightGrads();
  ~DeferWeightGrads();
  // One weight gradient kept for W: `make` enqueues it and returns it; run() adds it into `leaf`.
  struct Work {
    std::shared_ptr<TensorImpl> leaf;
    std::function<Tensor()> make;
  };
  std::vector<Work> take();  // the work kept so far (the scope keeps collecting)
  // A leaf whose gradient B must give now (a pipeline stage's received input, not a weight).
  void not_deferred(const Tensor& leaf) { keep_.push_back(leaf.ptr().get()); }
  // Enqueues it, in order, adds each gradient into its leaf and calls the gradient-ready hooks for
  // it; clears `work` (core/backward.cpp, beside backward()'s own adding).
  static void run(std::vector<Work>& work);
  // Whether the scope alive on this thread keeps leaf's gradient for W (backward() leaves its hooks to W).
  static bool defers(const TensorImpl* leaf);

 private:
  DeferWeightGrads* prev_;
  std::vector<Work> work_;
  std::vector<const TensorImpl*> keep_;
  std::unordered_set<const TensorImpl*> deferred_;  // leaves with a gradient in work_: W calls their hooks
  friend bool defer_weight_grad(const Tensor&, std::function<Tensor()>);
};
// Called by an op's backward for its input `w`: when a DeferWeightGrads scope is alive and w is a
// leaf that wants a gradient, keeps `make` (which enqueues w's gradient and returns it) for W and
// returns true; the op then returns no gradient for w. Otherwise returns false.
bool defer_weight_grad(const Tensor& w, std::function<Tensor()> make);

// Called by ops: when recording and any input needs a gradient, gives `out` a Node.
void record(const Tensor& out, const char* name, const std::vector<Tensor>& inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward);

// Gradient-ready hooks (DDP's autograd hook, core/dist/buckets.hpp): during backward(), the moment
// every kernel that adds into a leaf's gradient has been enqueued, each hook is called with that
// leaf (its grad now holds this pass's sum, once the queued work has run); for a weight gradient
// deferred to W (DeferWeightGrads), when W has enqueued it. Leaves become ready in
// the order backward reaches them, roughly the reverse of the forward pass. A hook runs on the
// thread that called backward() and must only enqueue work. add_ returns an id for remove_.
using GradReadyHook = std::function<void(TensorImpl& leaf)>;
int add_grad_ready_hook(GradReadyHook hook);
void remove_grad_ready_hook(int id);
std::vector<GradReadyHook> grad_ready_hooks();  // those added now, in the order added

}  // namespace d2l
