// The section's key-value store ("Key-Value Stores": push sends a worker's gradients to common
// storage where they are aggregated, pull retrieves the aggregate), over the processes of mpirun:
// MXNet's kv.init / kv.push / kv.pull as a thin, named face of core/dist's collectives.
//   init(key, value)   every rank stores rank 0's value under key (dist::broadcast)
//   push(key, values)  the stored value becomes the sum of `values` (one per local device) over every
//                      rank: summed on the first device, then dist::allreduce (no updater: MXNet's
//                      behaviour, the sum replaces what was stored)
//   pull(key, outs)    each of outs (any devices) receives a copy of the stored value
// Every rank must call the same operations on the same keys in the same order (the collectives pair
// up); keys are checked, shapes too. A ConfigError / ShapeError names what is wrong.
#pragma once
#include <map>
#include <vector>

#include "core/tensor.hpp"

namespace d2l::distributed {

class KVStore {
 public:
  void init(int key, const Tensor& value);
  void push(int key, const std::vector<Tensor>& values);
  void pull(int key, const std::vector<Tensor>& outs) const;

 private:
  const Tensor& stored(int key, const char* op) const;
  std::map<int, Tensor> store_;
};

}  // namespace d2l::distributed
