// Model parallelism on one machine (PyTorch's "Single-Machine Model Parallel Best Practices"): a toy
// model with one layer on each of two devices (Step 1), ResNet-50 cut in two halves on two devices
// (Step 2), the same cut micro-batched into a pipeline over K devices (Step 4, pipeline_resnet50.hpp),
// and the timing experiment of Steps 3-5 (experiment.hpp).
//
// A block moved to(dev) has its parameters there (one replica each); the activation crosses devices
// with to(), which is differentiable, so backward sends the gradient back the same way.
#pragma once
#include <memory>

#include "chapters/model_parallel/resnet50.hpp"
#include "core/nn/nn.hpp"

namespace d2l::mp {

// PyTorch's nn.MSELoss() (mean of (output - target)^2 over every element), which is twice d2l's
// squared loss. output and target of one shape on one device -> a (1) tensor.
Tensor mse(const Tensor& output, const Tensor& target);

// "Step 1": two linear layers on two devices.
//   net1 = Linear(10, 10) on dev0, relu, net2 = Linear(10, 5) on dev1
// nn.Linear's initialisation: weight and bias U(-1/sqrt(10), 1/sqrt(10)).
class ToyModel : public nn::Block {
 public:
  ToyModel(Device dev0, Device dev1);
  // x (N, 10) anywhere -> net2(relu(net1(x on dev0)) on dev1): (N, 5) on dev1
  Tensor forward(const Tensor& x) override;
  std::string type() const override { return "ToyModel"; }

  std::shared_ptr<nn::Dense> net1, net2;
  std::shared_ptr<nn::Activation> relu;
  Device dev0, dev1;
};

// The section's training configuration of the toy model, once: MSELoss, SGD lr 0.001, zero_grad,
// outputs = model(randn(20, 10)), labels = randn(20, 5) on dev1, backward, step. Prints where things
// are and the loss before and after the step (when verbose); returns {loss before, loss after}.
std::pair<float, float> toy_step(Device dev0, Device dev1, bool verbose = true);

// "Step 2": ResNet-50 in two halves,
//   seq1 = conv1, bn1, relu, maxpool, layer1, layer2  on dev0
//   seq2 = layer3, layer4, avgpool                     on dev1,   fc on dev1.
// It is a ResNet (as in the section: class ModelParallelResNet50(ResNet)), so its parameters keep
// torchvision's names; seq1 and seq2 hold the same blocks, in the order they run.
class ModelParallelResNet50 : public ResNet {
 public:
  ModelParallelResNet50(Device dev0, Device dev1, int64_t num_classes = 1000);
  // x (N, 3, H, W) anywhere -> fc(seq2(seq1(x on dev0) to dev1)): (N, num_classes) on dev1
  Tensor forward(const Tensor& x) override;
  std::string type() const override { return "ModelParallelResNet50"; }

  std::shared_ptr<nn::Sequential> seq1, seq2;
  Device dev0, dev1;
};

}  // namespace d2l::mp
