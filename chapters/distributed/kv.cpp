#include "chapters/distributed/kv.hpp"

#include <cstdio>
#include <string>

#include "chapters/distributed/distributed.hpp"
#include "core/autograd.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

namespace d2l::distributed {

void KVStore::init(int key, const Tensor& value) {
  if (store_.count(key)) throw ConfigError("kv.init: key " + std::to_string(key) + " is already initialised");
  NoGrad no_grad;
  Tensor v = value.clone();
  dist::broadcast(v, 0);
  store_[key] = v;
}

const Tensor& KVStore::stored(int key, const char* op) const {
  auto it = store_.find(key);
  if (it == store_.end())
    throw ConfigError(std::string("kv.") + op + ": key " + std::to_string(key) + " was never initialised (kv.init first)");
  return it->second;
}

void KVStore::push(int key, const std::vector<Tensor>& values) {
  const Tensor& s = stored(key, "push");
  if (values.empty()) throw ShapeError("kv.push: no values");
  NoGrad no_grad;
  Tensor sum = values[0].to(s.device()).clone();
  for (auto& v : values) {
    if (v.shape() != s.shape())
      throw ShapeError("kv.push: key " + std::to_string(key) + " holds " + str(s.shape()) + ", got " + str(v.shape()));
  }
  for (size_t i = 1; i < values.size(); ++i) add_(sum, values[i].to(s.device()));
  dist::allreduce(sum, "library");
  sum.copyto(s);
}

void KVStore::pull(int key, const std::vector<Tensor>& outs) const {
  const Tensor& s = stored(key, "pull");
  for (auto& o : outs) {
    if (o.shape() != s.shape())
      throw ShapeError("kv.pull: key " + std::to_string(key) + " holds " + str(s.shape()) + ", out has " + str(o.shape()));
    s.copyto(o);
  }
}

// The walk-through of the README: a key initialised on every process, each device of each process
// pushing ones (so the pulled value counts the devices of the whole job), then pulled everywhere.
void kv_walkthrough(const Config& cfg) {
  const int W = dist::world_size(), k = static_cast<int>(cfg.devices.size());
  const bool say = cfg.verbose && dist::rank() == 0;
  KVStore kv;
  const Shape shape{2, 3};
  kv.init(3, Tensor::full(shape, 2.0f, cfg.devices[0]));
  Tensor a = Tensor::zeros(shape, cfg.devices[0]);
  kv.pull(3, {a});
  if (say) std::printf("kv.init(3, 2 * ones(2, 3)); kv.pull(3, out=a): a = %g everywhere (rank 0's value on all %d processes)\n",
                       a.to_vector()[0], W);
  std::vector<Tensor> ones;
  for (auto d : cfg.devices) ones.push_back(Tensor::ones(shape, d));
  kv.push(3, ones);
  std::vector<Tensor> outs;
  for (auto d : cfg.devices) outs.push_back(Tensor::zeros(shape, d));
  kv.pull(3, outs);
  const float got = outs.back().to_vector()[0];
  if (say)
    std::printf("kv.push(3, [ones on each of %d device(s)]) on every process; kv.pull(3, out=[...]): %g on every device "
                "(%d processes x %d device(s): the sum replaces the stored 2)\n",
                k, got, W, k);
  if (got != static_cast<float>(W * k))
    throw std::logic_error("kv walk-through: pulled " + std::to_string(got) + ", expected " + std::to_string(W * k));
}

}  // namespace d2l::distributed
