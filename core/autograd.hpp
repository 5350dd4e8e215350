// Graph autograd (DESIGN.md "Tensors, autograd, parameters"). Each result of a differentiable op
// made while recording is on knows its Node: the op's name, its inputs and its backward. backward()
// from a scalar walks the graph in reverse topological order; each backward enqueues its kernels on
// the device where that node's tensors live, so per-device losses run their backward in parallel.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

struct Node {
  std::string name;                                   // op name, e.g. "matmul"
  std::vector<std::shared_ptr<TensorImpl>> inputs;    // edges to what the op read
  // Given d(loss)/d(output), returns d(loss)/d(input) per input (undefined = no gradient).
  std::function<std::vector<Tensor>(const Tensor& grad_out)> backward;
};

// Whether ops record graph nodes (on by default). The book's autograd.record() is the default here;
// NoGrad turns it off for evaluation and parameter updates.
bool grad_enabled();
class NoGrad {
 public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

 private:
  bool prev_;
};

// Training / evaluation mode, separate from NoGrad: BatchNorm uses batch statistics in training.
bool is_training();
class TrainMode {  // scope: TrainMode t(false) evaluates
 public:
  explicit TrainMode(bool training);
  ~TrainMode();
  TrainMode(const TrainMode&) = delete;
  TrainMode& operator=(const TrainMode&) = delete;

 private:
  bool prev_;
};

// Called by ops: when recording and any input needs a gradient, gives `out` a Node.
void record(const Tensor& out, const char* name, const std::vector<Tensor>& inputs,
            std::function<std::vector<Tensor>(const Tensor&)> backward);

// Runs backward from a one-element tensor (Tensor::backward calls this).
void backward(const Tensor& root);

// Gradient-ready hooks (DDP's autograd hook, core/dist/buckets.hpp): during backward(), the moment
// every kernel that adds into a leaf's gradient has been enqueued, each hook is called with that
// leaf (its grad now holds this pass's sum, once the queued work has run). Leaves become ready in
// the order backward reaches them, roughly the reverse of the forward pass. A hook runs on the
// thread that called backward() and must only enqueue work. add_ returns an id for remove_.
using GradReadyHook = std::function<void(TensorImpl& leaf)>;
int add_grad_ready_hook(GradReadyHook hook);
void remove_grad_ready_hook(int id);

namespace debug {
// Test-only mutation: when set to an op's name, that op's backward returns its first gradient
// times 1.1, so a gradient check must fail. Empty (the default) in every normal run.
extern std::string mutate_backward_of;
}  // namespace debug

}  // namespace d2l
