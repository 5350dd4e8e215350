// Cutting a Sequential into pipeline stages: measure what each layer costs, choose the cut that makes
// the slowest stage as fast as possible (a pipeline runs at the pace of its slowest stage), and split
// the Sequential there.
//
//   auto costs = pipeline::measure_layer_costs(*net, sample, cpu(0));   // net on cpu(0)
//   auto starts = pipeline::balance(costs, 2);                          // e.g. {0, 5}
//   auto parts = pipeline::partition(*net, starts);                     // net[0..4], net[5..]
//   parts[1]->to(cpu(1));
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "core/nn/sequential.hpp"

namespace d2l::pipeline {

// Partition of L layers (costs per layer, >= 0) into K contiguous, non-empty stages minimising the
// largest stage cost; returns the first layer index of each stage (size K, starts with 0). Among
// equally good partitions, the one whose stage boundaries come earliest. ConfigError if K < 1 or
// K > L, or for a negative or non-finite cost.
std::vector<size_t> balance(const std::vector<double>& layer_costs, size_t K);

// The cost of the most expensive stage of a partition (starts as balance() returns them).
double largest_stage_cost(const std::vector<double>& layer_costs, const std::vector<size_t>& starts);

// Each child's forward + backward time in seconds on device d (its parameters must live on d), the
// median of `repeats` runs after one warm-up run; the sample (N, ...) anywhere, moved to d, feeds the
// first child and each child's output feeds the next. The host waits for the device around each
// timed run (this is a measurement, not a pipeline). The children's gradients are zero afterwards;
// BatchNorm's running statistics move as in any training-mode forward. ConfigError if repeats < 1
// or the Sequential is empty.
std::vector<double> measure_layer_costs(nn::Sequential& layers, const Tensor& sample, Device d, int repeats = 3);

// Splits a Sequential's children into K Sequentials at the given boundaries (the children are
// shared, not copied: a parameter of part k is the same Parameter as in `layers`, named "j.weight"
// from its index j inside the part). ConfigError unless starts begins with 0 and strictly
// increases below layers.size().
std::vector<std::shared_ptr<nn::Sequential>> partition(const nn::Sequential& layers, const std::vector<size_t>& starts);

}  // namespace d2l::pipeline
