// Gluon's Trainer (book/000, 004): trainer.step(batch_size) sums each parameter's gradients over
// its replicas through a kvstore, applies SGD (momentum, weight decay) with the gradient scaled by
// 1 / batch_size, leaves every replica with the same new value, and resets the gradients.
//
// The update is MXNet's SGD with momentum (not PyTorch's: there the momentum buffer holds gradients
// and lr multiplies it afterwards, so a learning-rate change acts at once on the whole buffer):
//   mom = momentum * mom - lr * wd * w - (lr / batch_size) * sum over replicas of grad
//   w   = w + mom                                    (mom starts at zero; wd applies to every weight)
// A parameter that got no gradient this step (unused by the forward) holds a zero gradient, as
// gradients are zeroed, not removed, after each step; it is updated like the others, so weight decay
// and momentum still move it (PyTorch's behaviour after zero_grad(set_to_none=False); MXNet would
// stop with a stale-gradient error): autograd adds into the zeroed gradient in place, so an unused
// parameter looks the same as one whose gradient is zero.
// Parameters still waiting for their shape may be given to the constructor; step() needs them
// initialised (the book's error otherwise). Momentum follows a parameter moved by reset_ctx.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/dist/buckets.hpp"
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
  // dist_sync's gradient buckets (core/dist/buckets.hpp), built here when every parameter's shape is
  // known (run a forward pass first), so that the first step's backward already launches them;
  // otherwise at the first step, which then reduces everything after backward. ConfigError for a
  // kvstore without buckets.
  void set_buckets(const dist::BucketOptions& options);
  KVStore& kvstore() { return *kv_; }
  int64_t num_update() const { return num_update_; }

  // What a checkpoint needs to continue bit for bit: "momentum/<parameter name>" per trainable
  // parameter (device 0's replica; all replicas are equal) and "num_update", "learning_rate"
  // (one value each). load_state_dict checks names and shapes and names what is wrong.
  // The momentum is MXNet's (lr already folded in, see above); num_update is exact up to 2^24.
  std::map<std::string, HostTensor> state_dict() const;
  void load_state_dict(const std::map<std::string, HostTensor>& state);

 private:
  std::vector<std::pair<std::string, nn::ParameterPtr>> params_;  // trainable ones, in order
  SGDOptions options_;
  std::unique_ptr<KVStore> kv_;
  std::vector<std::vector<Tensor>> momentum_;  // per parameter, per replica
  // Per parameter, momentum in host memory: the state itself when the kvstore updates on the host
  // ('local'), otherwise values loaded by load_state_dict waiting for the next step to place them.
  std::vector<std::vector<float>> host_momentum_;
  // Puts parameter k's momentum where the kvstore wants it for these replicas (zeros at first).
  void place_state(size_t k, const std::vector<Tensor>& weights);
  int64_t num_update_ = 0;
};

}  // namespace d2l::optim
