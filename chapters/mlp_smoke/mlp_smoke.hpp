// The runtime's smoke program: a two-layer MLP trained data-parallel on a generated 10-class problem.
// Every device computes its shard of each minibatch; gradients are summed with the book's allreduce;
// every replica takes the same SGD step. Chapter 1 does the same for LeNet, the book's way.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device.hpp"

namespace d2l::smoke {

struct Config {
  std::vector<Device> devices{cpu(0), cpu(1)};
  int64_t batch_size = 128;
  float lr = 0.5f;
  int num_epochs = 10;
  uint64_t seed = 0;
  int64_t n_train = 4000, n_test = 1000;
  int64_t hidden = 64;
  bool verbose = true;
};

struct Result {
  std::vector<double> epoch_loss;  // mean training loss per epoch
  double test_acc = 0;
  double sec_per_epoch = 0;
  std::vector<uint64_t> kernels_per_device;  // kernels each device ran
};

Result run(const Config& cfg);

}  // namespace d2l::smoke
