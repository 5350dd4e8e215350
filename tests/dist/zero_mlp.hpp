// The small MLP the tests of ZeRO over the ranks share (tests/test_zero_dist.cpp,
// tests/test_sharded_checkpoint.cpp): 4 -> 5 (relu) -> 3, P = 43 trainable elements, which 2 and 4
// do not divide (uneven chunks, parameters straddling them); a global batch of 8 rows per step, rank
// r taking rows [8 r / W, 8 (r + 1) / W); the two optimizers' settings.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/nn.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"

namespace d2l::test {

constexpr int64_t kIn = 4, kHidden = 5, kOut = 3, kP = kIn * kHidden + kHidden + kHidden * kOut + kOut;
constexpr int64_t kGlobalBatch = 8;

inline std::shared_ptr<nn::Sequential> mlp_43() {
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Dense>(kHidden, "relu", true, kIn), std::make_shared<nn::Dense>(kOut, "", true, kHidden));
  manual_seed(42);  // the same initial values in every run, on every rank
  net->initialize(Init::Xavier(), {cpu(0)});
  return net;
}

struct Setup {
  std::string optimizer = "sgd";
  optim::OptimizerOptions opt{.learning_rate = 0.1f, .momentum = 0.9f, .wd = 1e-3f};
  std::string kvstore = "dist_sync";
};
inline Setup adam_setup() { return Setup{"adam", {.learning_rate = 0.01f, .wd = 1e-3f}}; }

inline optim::OptimizerOptions at_stage(optim::OptimizerOptions o, int stage,
                                        double bucket_mb = optim::OptimizerOptions{}.reduce_bucket_mb) {
  o.zero_stage = stage;
  o.reduce_bucket_mb = bucket_mb;
  return o;
}

using Values = std::map<std::string, std::vector<float>>;

inline Values params_of(const nn::ParameterDict& params) {
  Values out;
  for (auto& [name, p] : params) out[name] = p->list_data()[0].to_vector();
  return out;
}

inline Values state_values(const std::map<std::string, optim::HostTensor>& state) {
  Values out;
  for (auto& [key, t] : state) out[key] = t.values;
  return out;
}

// Step s's global batch: features from an LCG, labels from their signs; rows [lo, hi) of it through
// `run` (the net's forward, or FullyShardedDataParallel's), one loss (summed over the rows), backward.
inline void backward_rows(const std::function<Tensor(const Tensor&)>& run, int s, int64_t lo, int64_t hi) {
  const auto X = lcg_data(kGlobalBatch * kIn, 700 + static_cast<uint32_t>(s));
  std::vector<float> rows(X.begin() + lo * kIn, X.begin() + hi * kIn);
  std::vector<int32_t> y;
  for (int64_t i = lo; i < hi; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  Tensor Xt = Tensor::from_vector(rows, {hi - lo, kIn}, cpu(0));
  Tensor yt = Tensor::from_vector(y, {hi - lo}, cpu(0));
  softmax_cross_entropy(run(Xt), yt, Reduction::sum).backward();
}
inline void backward_rows(nn::Sequential& net, int s, int64_t lo, int64_t hi) {
  backward_rows([&](const Tensor& x) { return net(x); }, s, lo, hi);
}

// This rank's rows of every global batch, steps [from, to); norms: last_grad_norm() after each step.
inline void train_steps(nn::Sequential& net, optim::Trainer& trainer, int from, int to, std::vector<double>* norms = nullptr) {
  const int W = dist::world_size(), r = dist::rank();
  for (int s = from; s < to; ++s) {
    backward_rows(net, s, kGlobalBatch * r / W, kGlobalBatch * (r + 1) / W);
    trainer.step(kGlobalBatch);
    if (norms) norms->push_back(trainer.last_grad_norm());
  }
}

}  // namespace d2l::test
