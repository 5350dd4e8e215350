// Gluon's kvstores (d2l "Concise Implementation for Multiple GPUs"; the Gluon lab): how a Trainer sums each parameter's
// gradients over its replicas and where the optimizer's update (SGD or Adam) then runs. A key is a
// parameter's position in the Trainer; its values are one tensor per replica, on distinct devices, of
// one shape.
//   device  reduce on the devices: each key is summed on one of its devices, chosen so that the
//           keys (weighted by size) spread over the devices (MXNet's CommDevice); the sum is
//           copied back to every replica, which then updates itself.
//   local   reduce in host memory: the gradients are copied into a host buffer and summed there;
//           the update runs on a host copy of the weights, with the optimizer state (SGD's momentum,
//           Adam's m and v) kept in host memory;
//           the new weights are copied back to every replica.
//   ring    core/comm.hpp's allreduce_ring (reduce-scatter + all-gather), then each replica updates.
//   dist_sync       across processes (MXNet's name; core/dist): the replicas of a process are summed as
//                   'device' does, then across the processes with the library's allreduce
//                   (MPI_Allreduce), then copied back; each replica updates itself. In a world of
//                   one it is 'device'. dist_sync_ring: the same with our ring over MPI. With
//                   set_buckets (chapters 2 and 4: --bucket-mb), DDP's gradient buckets do the sums
//                   instead, launched during backward (core/dist/buckets.hpp); trainer.step only
//                   finishes them (reduce_all) and applies the update.
//   nccl    needs GPUs and a build with NCCL (this build has none): a ConfigError.
// device and local add the replicas in the same order (replica 0, then 1, ...), so they give the
// same bits; ring adds chunk by chunk in ring order (equal within float reassociation). With one
// replica nothing is summed and every kvstore updates the replica in place (MXNet uses no kvstore
// for one device).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "core/dist/buckets.hpp"
#include "core/dist/group.hpp"
#include "core/nn/block.hpp"
#include "core/ops.hpp"
#include "core/tensor.hpp"

namespace d2l::optim {

// One SGD step's constants, MXNet's sgd_mom_update with the gradient summed over replicas:
//   mom = momentum * mom - lr * wd * w - (lr / batch_size) * g
//   w   = w + mom
struct SGDStep {
  float momentum = 0.0f;
  float decay = 0.0f;       // -lr * wd
  float grad_scale = 0.0f;  // -lr / batch_size
};

// The step on one device: four kernels (scale_, add_) on w's device; w, mom, g of one shape there.
void sgd_step(const Tensor& w, const Tensor& mom, const Tensor& g, const SGDStep& s);
// The same float operations in the same order, on host arrays of n floats ('local').
void sgd_step(float* w, float* mom, const float* g, int64_t n, const SGDStep& s);

// One Adam step's constants: AdamStep (core/ops.hpp, beside the op adam_update_ that runs it), PyTorch's
// torch.optim.Adam with the gradient summed over replicas and scaled by grad_scale = 1 / batch_size.
// adam_constants: s with step t's (t = 1, 2, ...) step_size = lr / (1 - beta1^t) and
// bias_correction2_sqrt = sqrt(1 - beta2^t), computed in double and rounded once.
AdamStep adam_constants(AdamStep s, float lr, int64_t t);

// The step on one device: the op adam_update_ (kernels/{cpu,cuda}/adam) on w's device; w, m, v, g of one
// shape there. m and v are the parameter's first and second moments (zeros before step 1).
void adam_step(const Tensor& w, const Tensor& m, const Tensor& v, const Tensor& g, const AdamStep& s);
// The same float operations in the same order (kernels/cpu/adam.cpp's), on host arrays of n floats ('local').
void adam_step(float* w, float* m, float* v, const float* g, int64_t n, const AdamStep& s);

// A step of either optimizer, and how many state tensors it keeps per parameter and replica, its slots:
// SGD 1 (momentum), Adam 2 (m, v), in that order.
using Step = std::variant<SGDStep, AdamStep>;
size_t state_slots(const Step& s);
// Step s on one device: w, g and the state's slots (state_slots(s) tensors) of one shape there.
void step_on_device(const Tensor& w, const std::vector<Tensor>& state, const Tensor& g, const Step& s);

// torch.nn.utils.clip_grad_norm_ on the gradient the optimizer uses, g = (sum over replicas) / batch_size
// (the Trainer's clip_grad_norm): total_norm = ||g||_2 over every trainable element, clip_coef =
// max_norm / (total_norm + 1e-6), and where clip_coef < 1 the step's grad_scale is multiplied by it
// (the gradients themselves are not touched: no pass over them beyond the norm's).
// The same squares tell a GradScaler (core/optim/grad_scaler.hpp) whether the summed gradient holds an
// inf or a NaN: their double sum is finite exactly when every float gradient element is (a float's
// square is at most 1.2e77, far from a double's overflow).
struct GradClip {
  float max_norm = 0.0f;  // > 0: clip; 0: only the norm and found_inf (a GradScaler's step without clipping)
  int64_t batch_size = 1;
  // The gradients are those of a loss multiplied by loss_scale (GradScaler): the norm is divided by it,
  // the norm of the unscaled gradient, as clip_grad_norm_ after GradScaler.unscale_.
  float loss_scale = 1.0f;
  // found_inf summed over these groups of ranks (as FSDP's ShardedGradScaler all-reduces its
  // found_inf over its process group): the Trainer's dp group and tp group, so that every rank it
  // trains with skips a step together, even where a gradient is not summed over them (tensor
  // parallelism's slices); a collective over each, whose every rank calls apply.
  std::vector<dist::Group> found_inf_over{};
  double total_norm = 0;   // what the last apply() found
  bool found_inf = false;  // and whether the squares were not finite (then s is returned unclipped)
  // s for the summed gradient whose squares add up to sum_of_squares (over every shard, every rank).
  Step apply(const Step& s, double sum_of_squares);
  // Tensor parallelism over processes (Megatron-LM's clip_grad_norm): split[k] says whether the
  // Trainer's parameter k is a slice split over tp_group (Parameter::split_over_ranks). The squares
  // of the slices are added over the group (a collective: every rank of it calls apply), those of
  // the other parameters, which every rank of the group holds whole, counted once.
  std::optional<dist::Group> tp_group{};
  std::vector<bool> split{};
  bool is_split(size_t k) const { return k < split.size() && split[k]; }
  Step apply(const Step& s, double split_squares, double other_squares);
};
// The sum of the squares of t's elements (float32), read to host memory and added in double: a
// teaching framework's choice, not a fast one (a copy to the host per step). A float's square is exact
// in double and the double sums of the shards differ from the unsharded one by about 1e-16, far below
// a float's step: every stage finds the float norm, and the bits, of the replicated run (a sum in
// float on the device would round differently for every cut).
double sum_of_squares(const Tensor& t);

// One replica's step: its weights, its state's slots and its gradient, on one device.
struct ReplicaStep {
  Tensor w;
  std::vector<Tensor> state;
  Tensor g;
};
// Step s on every replica of the list: each device's replicas in one kernel launch when it has several
// (multi_sgd_mom_update_ or multi_adam_update_; a table of at most 64 tensors a launch), else
// step_on_device. The same bits either way: the multi-tensor kernels compute what the per-tensor ones do.
void step_on_devices(const std::vector<ReplicaStep>& replicas, const Step& s);

class KVStore {
 public:
  virtual ~KVStore() = default;
  const std::string& type() const { return type_; }

  // MXNet's kv.pushpull(key, values, out=values): every values[i] ends holding the sum over i, the
  // same bits on every device. One value: nothing to do.
  virtual void pushpull(int64_t key, const std::vector<Tensor>& values) = 0;

  // Whether a key with this many replicas keeps its optimizer state in host memory ('local' with
  // two or more) rather than its state tensors beside each replica.
  virtual bool updates_on_host(size_t replicas) const {
    (void)replicas;
    return false;
  }

  // Trainer::step for one key: sums grads over the replicas and applies `s`; afterwards every
  // weights[i] holds the same bits. The state has state_slots(s) slots: state[j][i] is slot j on
  // replica i (on its device) or, when updates_on_host, host_state[j] (numel floats). grads are left
  // holding the sum (local: unchanged); the Trainer zeroes them.
  // summed: the gradients already hold the sum (reduce_all or pushpull did it); only the step runs.
  virtual void update(int64_t key, const std::vector<Tensor>& weights, const std::vector<Tensor>& grads,
                      const std::vector<std::vector<Tensor>>& state, std::vector<std::vector<float>>& host_state,
                      const Step& s, bool summed = false);

  // Trainer::step for every key at once, key k = 0, 1, ... with weights[k], grads[k], state[k] and
  // host_state[k] as update() takes them: each key's gradients are summed (pushpull, key by key), then
  // the replicas that update themselves do so together, one launch per device (step_on_devices); the
  // others (updates_on_host, devices of several kinds) as update() does. The same bits as update() key by key.
  void update_all(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::vector<Tensor>>& grads,
                  const std::vector<std::vector<std::vector<Tensor>>>& state,
                  std::vector<std::vector<std::vector<float>>>& host_state, const Step& s, bool summed = false);

  // dist_sync's gradient buckets (core/dist/buckets.hpp, chapter 4): Trainer::step first calls
  // reduce_all with every trainable parameter's replicas (registration order). A kvstore with
  // buckets finishes their allreduces there (most already ran during backward) and returns true;
  // the others return false and reduce key by key in update().
  virtual bool reduce_all(const std::vector<std::vector<Tensor>>& weights) {
    (void)weights;
    return false;
  }
  // Turns the buckets on with these options (dist_sync, dist_sync_ring); a ConfigError elsewhere.
  virtual void set_buckets(const dist::BucketOptions& options);
  // The ranks dist_sync and dist_sync_ring sum over: the world by default, or a process group (a
  // grid's dp group, core/dist/grid.hpp; no buckets then). A ConfigError for the other kvstores.
  virtual void set_group(const dist::Group& group);
  // Builds what reduce_all needs for these replicas ahead of the first step (the buckets and their
  // gradient hooks); reduce_all builds it otherwise. Nothing for the other kvstores.
  virtual void prepare(const std::vector<std::vector<Tensor>>& weights) { (void)weights; }

  // 'device': the device each key seen so far is reduced on (the others: empty).
  virtual std::map<int64_t, Device> placement() const { return {}; }

 protected:
  explicit KVStore(std::string type) : type_(std::move(type)) {}
  // The replica whose update is copied to the others when the replicas' devices are of different
  // kinds (update() explains why); 'device' uses the key's reducing device.
  virtual size_t home(int64_t key, const std::vector<Tensor>& values) const {
    (void)key, (void)values;
    return 0;
  }

 private:
  std::string type_;
};

// dist_sync's start: every parameter (weights and states such as BatchNorm's running statistics)
// on every replica of every rank becomes rank root's replica 0, then the ranks check that they hold
// the same bits (dist::CollectiveError otherwise). Shapes must be known (run a forward pass first).
// states_only: only the parameters without a gradient (running statistics).
void broadcast_parameters(const nn::ParameterDict& params, int root = 0, bool states_only = false);

// "device", "local", "ring", "dist_sync", "dist_sync_ring" or "none" (MXNet's kvstore=None: no sum over
// the replicas, each updated from its own gradient, for tensor parallelism's replicated tensors).
// "nccl" (no NCCL in this build) and any other name: a ConfigError naming the choices.
std::unique_ptr<KVStore> create_kvstore(const std::string& name);

}  // namespace d2l::optim
