// The unsharded MLP the tensor-parallel tests shard (tests/test_tensor_parallel.cpp over a process's
// devices, tests/test_dist_grid.cpp over the ranks of a group): d_model -> hidden (relu) -> d_model on
// cpu(0), its sizes, the tolerances the shards are held to, the learning rate, and a batch through it.
#pragma once
#include <cstdint>
#include <vector>

#include "check.hpp"
#include "core/nn/dense.hpp"
#include "core/ops.hpp"

namespace d2l::test::reference_mlp {

constexpr int64_t kBatch = 6, kModel = 8, kHidden = 16;
constexpr double kMlpAtol = 1e-6, kMlpRtol = 1e-5;
constexpr float kLr = 0.1f;

struct ReferenceMlp {
  nn::Dense fc1{kHidden, "relu", true, kModel}, fc2{kModel, "", true, kHidden};

  // Initialised by `init` on cpu(0), then the biases from lcg_data (seeds b1_seed and b2_seed): not
  // zero, so that the bias of each layer is checked too.
  ReferenceMlp(const Init& init, uint32_t b1_seed, uint32_t b2_seed) {
    for (nn::Dense* fc : {&fc1, &fc2}) fc->collect_params().initialize(init, {cpu(0)});
    fc1.bias->set_data(Tensor::from_vector(lcg_data(kHidden, b1_seed), {kHidden}, cpu(0)));
    fc2.bias->set_data(Tensor::from_vector(lcg_data(kModel, b2_seed), {kModel}, cpu(0)));
  }

  // A batch of inputs X and targets T (kBatch x kModel, from lcg_data with seeds x_seed and t_seed)
  // through the MLP, and the backward of the MSE: x holds dL/dx, the parameters' gradients accumulate.
  struct Batch {
    std::vector<float> X, T;
    Tensor x, y;
  };
  Batch forward_backward(uint32_t x_seed, uint32_t t_seed) {
    Batch b{lcg_data(kBatch * kModel, x_seed), lcg_data(kBatch * kModel, t_seed), Tensor(), Tensor()};
    b.x = Tensor::from_vector(b.X, {kBatch, kModel}, cpu(0)).attach_grad();
    b.y = fc2(fc1(b.x));
    mse_loss(b.y, Tensor::from_vector(b.T, {kBatch, kModel}, cpu(0))).backward();
    return b;
  }
};

}  // namespace d2l::test::reference_mlp
