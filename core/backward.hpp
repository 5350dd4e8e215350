// The backward pass: from a one-element loss through the graph the ops recorded (core/autograd.hpp),
// adding each gradient with the ops' own kernels, so it stands above them. Tensor::backward,
// attach_grad and zero_grad are defined beside it (core/backward.cpp).
#pragma once
#include "core/autograd.hpp"
#include "core/tensor.hpp"

namespace d2l {

// Runs backward from a one-element tensor (Tensor::backward calls this). As in PyTorch, each node's
// saved tensors are freed once its backward has run (retain_graph=False), unless another graph
// still leads to the node (several losses sharing a part, each with its own backward); a second
// backward through a freed node is a logic_error that says so.
void backward(const Tensor& root);

}  // namespace d2l
