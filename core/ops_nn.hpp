// Convolutional-network ops on tensors (NCHW): conv2d, pooling, batch norm. Forward and backward
// kernels in kernels/cpu/{conv2d,pool2d,batch_norm}.cpp.
#pragma once
#include <array>

#include "core/tensor.hpp"

namespace d2l {

using Pair = std::array<int64_t, 2>;  // (height, width)

// x (N, C, H, W), w (OC, C, KH, KW), optional bias b (OC) (pass Tensor() for none) -> (N, OC, OH, OW).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride = {1, 1}, Pair padding = {0, 0});
// Pooling windows never read padding as a value: max ignores it, avg divides by KH*KW (PyTorch's
// and Gluon's default count_include_pad). stride defaults to the window (the frameworks' default).
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor global_avg_pool2d(const Tensor& x);  // (N, C, H, W) -> (N, C, 1, 1)

// Batch norm over axis 1 of x (N, C) or (N, C, H, W). In training mode (is_training()) it
// normalises with the batch statistics and updates running_mean / running_var in place:
// running = (1 - momentum) * running + momentum * batch (unbiased variance); in evaluation mode it
// uses the running statistics. gamma, beta, running_* are (C) on x's device.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, float momentum = 0.1f, float eps = 1e-5f);

}  // namespace d2l
