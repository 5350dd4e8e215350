// Gluon's Trainer (book/000, 004): trainer.step(batch_size) sums each parameter's gradients over
// its replicas through a kvstore, applies SGD (momentum, weight decay) with the gradient scaled by
// 1 / batch_size, leaves every replica with the same new value, and resets the gradients.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/block.hpp"

namespace d2l::optim {

class KVStore;  // core/optim/kvstore.hpp

struct SGDOptions {
  float learning_rate = 0.01f;
  float momentum = 0.0f;
  float wd = 0.0f;  // weight decay: the gradient gets wd * weight added
};

// A tensor's values in host memory, for checkpoints.
struct HostTensor {
  Shape shape;
  std::vector<float> values;
};

class Trainer {
 public:
  // optimizer: "sgd" (the only one; anything else is a ConfigError naming the choices).
  // kvstore: "device", "local", "ring", or "nccl" (a build with NCCL, on GPUs); ConfigError otherwise.
  Trainer(const nn::ParameterDict& params, const std::string& optimizer, SGDOptions options,
          const std::string& kvstore = "device");
  ~Trainer();

  void step(int64_t batch_size);
  void set_learning_rate(float lr);
  float learning_rate() const { return options_.learning_rate; }
  const SGDOptions& options() const { return options_; }
  const std::string& kvstore_type() const;
  int64_t num_update() const { return num_update_; }

  // What a checkpoint needs to continue bit for bit: "momentum/<parameter name>" per trainable
  // parameter (device 0's replica; all replicas are equal) and "num_update", "learning_rate"
  // (one value each). load_state_dict checks names and shapes and names what is wrong.
  std::map<std::string, HostTensor> state_dict() const;
  void load_state_dict(const std::map<std::string, HostTensor>& state);

 private:
  std::vector<std::pair<std::string, nn::ParameterPtr>> params_;  // trainable ones, in order
  SGDOptions options_;
  std::unique_ptr<KVStore> kv_;
  std::vector<std::vector<Tensor>> momentum_;  // per parameter, per replica
  int64_t num_update_ = 0;
};

}  // namespace d2l::optim
