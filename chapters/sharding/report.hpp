// What chapter 5 prints: the tables and the check lines (each returns the number of checks failed).
#pragma once
#include <string>

#include "chapters/sharding/sharding.hpp"

namespace d2l::sharding {

int print_zero(const Config& cfg, const ZeroResult& r);
// One row of a memory table (devices or ranks): the bytes measured by tag beside the paper's formula
// and its value, the gathered units, the peak and what else it held; `where` names the holder (in a
// column of where_width), `shard` its share of the state and the sum (Psi_i; Psi'_r at stage 3 over
// the ranks).
void print_memory_row(const MemoryRow& m, const std::string& where, const std::string& shard, int where_width,
                      int formula_width);
// The ladder: at each N, the largest peak per device (or rank) of every stage, each below the one before.
void print_ladder(const ZeroResult& r);
// --save: the checkpoint's files and their sizes on disk, one line.
void print_saved(const Config& cfg, const ZeroResult& r);
void print_tensor_parallel_title(const Config& cfg);
int print_tensor_parallel(const Config& cfg, const TensorParallelResult& r);

}  // namespace d2l::sharding
