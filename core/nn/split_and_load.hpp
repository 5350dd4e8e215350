// Gluon's gluon.utils.split_and_load (d2l "Concise Implementation for Multiple GPUs"; the Gluon lab): a batch is cut along axis 0 into one shard per
// device and shard i is copied to devices[i]; each device then runs the forward pass on its shard.
//
//   auto X_shards = split_and_load(X, {cpu(0), cpu(1)});          // (10, ...) -> (5, ...), (5, ...)
//   auto [Xs, ys] = split_and_load(batch, devices, false);         // a host Batch: X and y shards
//
// even_split = true: the batch size must be a multiple of the device count (Gluon's error
// otherwise). even_split = false: shards differ by at most one row, the first ones get the extra
// rows (10 over 3 devices: 4, 3, 3). Shards are never empty: a batch with fewer rows than devices
// gives one row to each of the first devices and nothing to the rest (Gluon makes fewer slices
// too), so there may be fewer shards than devices; each shard's device() says where it is.
//
// Devices of unequal speed (the book's exercise) get shards in proportion to weights:
// shard_sizes(n, weights), and probe_weights() measures them by timing a short probe on each device.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "core/tensor.hpp"

namespace d2l::nn {

// A minibatch in host memory, as a data loader yields it (datasets/data_iter.hpp's Batch, or any type
// with the members X, y, shape and n): core reads it through this view and knows nothing of datasets.
struct HostBatch {
  const std::vector<float>& X;    // (n, ...) features
  const std::vector<int32_t>& y;  // (n) labels
  const Shape& shape;             // X's shape
  int64_t n;
  template <class B>
  HostBatch(const B& b) : X(b.X), y(b.y), shape(b.shape), n(b.n) {}  // NOLINT: implicit on purpose
};

// Rows per shard for n rows over `devices` devices, as described above (zeros left out).
// even_split with n not a multiple of devices: a ShapeError naming n and the device count.
std::vector<int64_t> even_shard_sizes(int64_t n, size_t devices, bool even_split);

// data (N, ...) on any device -> shard i (rows of shard i, ...) on devices[i]. Not recorded by
// autograd unless data itself needs a gradient (then the copies are differentiable).
std::vector<Tensor> split_and_load(const Tensor& data, const std::vector<Device>& devices, bool even_split = true);

// Host data: values (shape) row-major, float32 features or int32 labels.
std::vector<Tensor> split_and_load(const std::vector<float>& values, const Shape& shape,
                                   const std::vector<Device>& devices, bool even_split = true);
std::vector<Tensor> split_and_load(const std::vector<int32_t>& labels, const Shape& shape,
                                   const std::vector<Device>& devices, bool even_split = true);

// A data-loader batch: X shards (features) and y shards (int32 labels), rows matching.
struct BatchShards {
  std::vector<Tensor> X, y;
};
BatchShards split_and_load(const HostBatch& batch, const std::vector<Device>& devices, bool even_split = true);

// ---- devices of unequal speed
// Rows per device in proportion to weights (positive, finite), by the largest-remainder method
// (floors of n * w_i / sum(w), the rows left over to the largest fractions, ties to the earlier
// device). The sizes add up to n and none is negative; when n >= the number of devices none is
// empty (an empty one takes a row from the largest). Bad weights: a ConfigError.
std::vector<int64_t> shard_sizes(int64_t n, const std::vector<double>& weights);

// As split_and_load, with shard i of shard_sizes(N, weights)[i] rows; empty shards are left out.
std::vector<Tensor> split_and_load(const Tensor& data, const std::vector<Device>& devices,
                                   const std::vector<double>& weights);
BatchShards split_and_load(const HostBatch& batch, const std::vector<Device>& devices, const std::vector<double>& weights);

// probe_weights: `step(d)` runs a short piece of representative work on device d (one training
// step on a small batch, say); the host waits for every device after it. Each device is probed
// alone (one warm-up call, then `repeats` timed calls, the fastest kept), so they do not compete
// for cores. Returns weights proportional to speed (1 / time), summing to 1. The timer returns
// seconds; tests pass a fake one. A probe that takes no measurable time is a ConfigError.
using ProbeStep = std::function<void(Device)>;
using Timer = std::function<double()>;
double wall_seconds();  // std::chrono::steady_clock
std::vector<double> probe_weights(const std::vector<Device>& devices, const ProbeStep& step,
                                  const Timer& timer = wall_seconds, int repeats = 3);

}  // namespace d2l::nn
