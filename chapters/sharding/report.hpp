// What chapter 5 prints: the tables and the check lines (each returns the number of checks failed).
#pragma once
#include "chapters/sharding/sharding.hpp"

namespace d2l::sharding {

int print_zero(const Config& cfg, const ZeroResult& r);
// The ladder: at each N, the largest peak per device (or rank) of every stage, each below the one before.
void print_ladder(const ZeroResult& r);
void print_tensor_parallel_title(const Config& cfg);
int print_tensor_parallel(const Config& cfg, const TensorParallelResult& r);

}  // namespace d2l::sharding
