// Gluon's Trainer (d2l "Concise Implementation for Multiple GPUs"; the Gluon lab): trainer.step(batch_size) sums each parameter's gradients over
// its replicas through a kvstore, applies the optimizer (SGD with momentum and weight decay, or Adam)
// with the gradient scaled by 1 / batch_size, leaves every replica with the same new value, and
// resets the gradients.
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
//
// "adam" is PyTorch's torch.optim.Adam (core/ops.hpp's op adam has the formula): weight decay wd is
// added to the gradient (not AdamW), g = sum over replicas / batch_size + wd * w, and step t =
// num_update() + 1 corrects the bias of m and v: w -= lr * m_hat / (sqrt(v_hat) + epsilon). An unused
// parameter's zero gradient is a gradient here too (m and v decay, w keeps moving), as in PyTorch
// after zero_grad(set_to_none=False). Every kvstore runs it, as it runs SGD.
// Parameters still waiting for their shape may be given to the constructor; step() needs them
// initialised (the book's error otherwise). The optimizer state (momentum; m and v) follows a
// parameter moved by reset_ctx.
//
// zero_stage 1 (ZeRO, Rajbhandari et al. 2020; core/optim/zero.hpp) keeps that state sharded: with N
// devices each keeps and updates 1/N of the flat parameter vector and the updated shards are
// all-gathered into every replica. The same update, the same bits on every replica, 1/N of the state.
// zero_stage 2 sums the gradients with a reduce-scatter instead of an allreduce: each device ends
// with the summed gradient of its own shard only, the one part of the sum it reads.
// With kvstore dist_sync or dist_sync_ring every stage shards over the processes instead: rank r of W
// keeps chunk r of the flat vector on its first device (stage 3: of each layer's flat vector). One
// class holds every stage wherever the shards live (zero::RankShards, core/optim/zero.hpp).
#pragma once
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/buckets.hpp"
#include "core/dist/group.hpp"
#include "core/nn/block.hpp"
#include "core/optim/shards.hpp"

namespace d2l::optim {

namespace zero {
class RankShards;    // core/optim/zero.hpp
}

// The optimizer's hyperparameters, Gluon's optimizer_params: SGD reads learning_rate, momentum and wd;
// Adam reads learning_rate, wd, beta1, beta2 and epsilon (PyTorch's defaults; its default learning
// rate is 1e-3: pass it, {.learning_rate = 1e-3f}). A field the optimizer does not read must keep its
// default (a ConfigError otherwise).
// ZeRO over processes with several devices each (OptimizerOptions::shard_over): what
// holds the shards, FSDP's sharding strategies with a process per machine.
//   ranks        the shards are the ranks (the dp_group, else the world); a process's devices are
//                replicas of each other, the rank's chunk of the state on its first device
//                (core/optim/zero.hpp);
//   devices      HYBRID_SHARD: the shards are each process's devices, replicated over the ranks:
//                device i of every rank keeps shard i, whose summed gradient is all-reduced over the
//                ranks before its update (core/optim/zero.hpp, replicate_over); at stage 3 the
//                parameters' shards too, so a unit is gathered over the process's devices only;
//   all_devices  every device of every rank its own shard, W k of them (FULL_SHARD with a rank per
//                device): device i of rank r keeps the state of shard r k + i; the rank's devices'
//                shards together are its chunk, reduce-scattered and all-gathered over the ranks as
//                with `ranks` (the one split rule nests: shards r k to r k + k - 1 of W k are chunk r of W).
enum class ShardOver { ranks, devices, all_devices };
const char* shard_over_name(ShardOver s);

struct OptimizerOptions {
  float learning_rate = 0.01f;
  float momentum = 0.0f;  // SGD's
  float wd = 0.0f;        // weight decay: the gradient gets wd * weight added
  float beta1 = 0.9f;     // Adam's: the decay of the first moment m, in [0, 1)
  float beta2 = 0.999f;   //         of the second moment v, in [0, 1)
  float epsilon = 1e-8f;  //         added to sqrt(v_hat), >= 0
  // Either optimizer: torch.nn.utils.clip_grad_norm_ before the update. total_norm = the 2-norm of the
  // gradient the optimizer uses, (sum over replicas) / batch_size, over every trainable parameter (at
  // every stage the whole sum's, read from its shards, over the processes too); where clip_coef =
  // clip_grad_norm / (total_norm + 1e-6) is below 1 the step uses the gradient times clip_coef.
  // 0: off (the step as without it); a finite number >= 0. Tensor parallelism's slices over
  // processes count as parts of one tensor with tp_group set (below); without it, and for the layers
  // split over the devices of one process, each replica's own gradient counts.
  float clip_grad_norm = 0.0f;
  // Where the state lives, for either optimizer (DeepSpeed's zero_optimization.stage):
  // 0 every device keeps the whole state of its replica (data parallelism);
  // 1 ZeRO stage 1: device i of N keeps, and updates, the state of shard i only (core/optim/zero.hpp);
  //   needs kvstore 'device' or 'ring' and every trainable parameter on the same devices.
  //   With kvstore 'dist_sync' or 'dist_sync_ring', the shards are the processes: rank r of W keeps
  //   the state of chunk r (dist::chunk_begin's split) on its first device (core/optim/zero.hpp;
  //   a process's other devices hold replicas of its parameters, unless shard_over says otherwise),
  //   updates it after a
  //   reduce-scatter (or the buckets' allreduce), then dist::allgather; state_dict() is then a collective.
  // 2 ZeRO stage 2: as 1, and the gradients are reduce-scattered (core/comm.hpp), not all-reduced:
  //   device i receives the summed gradient of shard i only. The same kvstores and devices as 1;
  //   over the processes the gradients are reduce-scattered during backward in buckets of
  //   reduce_bucket_mb (dist::reduce_scatter_async), giving rank r chunk r's sum, and each .grad
  //   buffer is released once packed into its bucket (DDP's all-reducing buckets are refused).
  // 3 ZeRO stage 3 (FSDP): the parameters sharded too; the net runs through
  //   optim::FullyShardedDataParallel (core/optim/fsdp.hpp), which gathers each layer's parameters
  //   just before its forward and its backward and adds each gradient into the shards that own it;
  //   device i keeps shard i of each layer's flat vector.
  //   With kvstore 'dist_sync' or 'dist_sync_ring' the shards are the ranks (of the dp_group, else the
  //   world): rank r keeps chunk r of each unit's flat vector on its first device, its other devices
  //   holding a unit only while it runs (core/optim/zero.hpp);
  //   state_dict() is a collective.
  int zero_stage = 0;
  // Stages 1 and 2 over the processes (kvstore dist_sync or dist_sync_ring): the gradients are
  // reduce-scattered in buckets of this many MiB, consecutive parameters from the last one back
  // (DeepSpeed's reduce_bucket_size, DDP's bucket_cap_mb; 0: one reduce-scatter per parameter);
  // at stage 2 each bucket goes during backward once its gradients are complete
  // (core/optim/zero.hpp). Every bucket size gives the same bits. >= 0.
  double reduce_bucket_mb = 25;
  // The grid's groups (core/dist/grid.hpp), over processes. dp_group: the ranks kvstore dist_sync or
  // dist_sync_ring sums the gradients over and, at zero_stage 1 to 3, shards over: a grid's column,
  // ZeRO on the dp group (Megatron-LM's distributed optimizer); unset: the world. DDP's buckets take
  // the world only (ConfigError). tp_group: the ranks a parameter
  // marked split_over_ranks (core/parameter.hpp) is split over; clip_grad_norm then adds the squares
  // of such slices over it and counts the other parameters once, so the norm is the unsharded
  // model's (stages 0 to 2; ConfigError at stage 3 and with shards over the devices of a process).
  std::optional<dist::Group> dp_group{}, tp_group{};
  // Stages 1 and 2 with kvstore dist_sync or dist_sync_ring and several devices per process: what
  // holds the shards (ShardOver, above; all_devices at stage 3 too: each device its piece of every
  // unit's chunk). Other than `ranks`: a ConfigError with another kvstore; `devices` at stage 3 and
  // with DDP's buckets too.
  ShardOver shard_over = ShardOver::ranks;
};
using SGDOptions = OptimizerOptions;  // its name while SGD was the only optimizer

// A tensor's values in host memory, for checkpoints.
struct HostTensor {
  Shape shape;
  std::vector<float> values;
};

class Trainer {
 public:
  // optimizer: "sgd" or "adam" (anything else is a ConfigError naming the choices).
  // kvstore: "device", "local", "ring", "dist_sync", "dist_sync_ring", "nccl" (a build with NCCL,
  // on GPUs), or "none" (nothing summed over a parameter's replicas: tensor parallelism's replicated
  // tensors, whose every replica holds the whole gradient); ConfigError otherwise.
  Trainer(const nn::ParameterDict& params, const std::string& optimizer, OptimizerOptions options,
          const std::string& kvstore = "device");
  ~Trainer();

  void step(int64_t batch_size);
  // GradScaler's step (core/optim/grad_scaler.hpp): the gradients are those of a loss multiplied by
  // loss_scale. The step uses them divided by it (folded into the step's constants, as the batch size
  // is), or, where any summed gradient holds an inf or a NaN (on any device; over the processes on
  // any rank of the dp group or the tp group: found_inf is summed over both), it is skipped: the weights, the optimizer state and
  // num_update stay as they were, the gradients are zeroed, and step_scaled returns false.
  // clip_grad_norm clips by the unscaled gradient's norm.
  bool step_scaled(int64_t batch_size, float loss_scale);
  void set_learning_rate(float lr);
  float learning_rate() const { return options_.learning_rate; }
  const OptimizerOptions& options() const { return options_; }
  const std::string& optimizer() const { return optimizer_; }
  const std::string& kvstore_type() const;
  // dist_sync's gradient buckets (core/dist/buckets.hpp), built here when every parameter's shape is
  // known (run a forward pass first), so that the first step's backward already launches them;
  // otherwise at the first step, which then reduces everything after backward. ConfigError for a
  // kvstore without buckets.
  void set_buckets(const dist::BucketOptions& options);
  KVStore& kvstore() { return *kv_; }
  int64_t num_update() const { return num_update_; }
  // With clip_grad_norm: the last step's total_norm (before clipping); NaN before the first such step.
  float last_grad_norm() const { return last_grad_norm_; }

  // The optimizer's state, per trainable parameter, in slots: state_names() lists them, "momentum"
  // for sgd, "exp_avg" and "exp_avg_sq" (PyTorch's names for m and v) for adam. state(parameter,
  // slot): that parameter's slot, one tensor per replica, each on its replica's device. It is empty
  // before the first step, after load_state_dict until the next step, where the kvstore keeps
  // the state in host memory ('local' with 2 or more replicas), and with zero_stage 1 to 3 (in the
  // shards there, shards()); state_dict() has it then. A name that is not a trainable parameter's,
  // or not a slot, is a ParameterError.
  const std::vector<std::string>& state_names() const { return state_names_; }
  const std::vector<Tensor>& state(const std::string& parameter, const std::string& slot) const;

  // Per device holding a replica (in the order of the first parameter's devices), the bytes of its
  // replicas, their gradients and the optimizer state there. State in host memory ('local', or
  // loaded and not yet placed by a step) is on no device; there is none before the first step.
  // Replicated, a device holds 4 * slots * P bytes of state for P trainable elements (SGD with
  // momentum 4 bytes an element, Adam 8); with zero_stage 1 or 2, 4 * slots * (its shard's size).
  // The summed gradient: 4 P on every device, 4 * (its shard's size) at stage 2 (after a step).
  // Stage 3 (between steps): parameters, summed gradient and state of its shard only, no .grad buffers.
  std::vector<DeviceMemory> memory_per_device() const;
  // zero_stage 1, 2 or 3: the shards, wherever they live (core/optim/shards.hpp; null at stage 0).
  const zero::Shards* shards() const { return zero_.get(); }
  zero::Shards* shards() { return zero_.get(); }
  // zero_stage 3: the parameters become shards (every trainable parameter initialised; the first
  // call releases the replicas' memory), for FullyShardedDataParallel; units[u]: the indices of unit
  // u's parameters. ConfigError at other stages.
  zero::Shards& fully_shard(const std::vector<std::vector<size_t>>& units);
  // The index of a trainable parameter of this trainer in its flat order, -1 for any other.
  int64_t index_of(const Parameter& p) const;
  size_t num_parameters() const { return params_.size(); }  // trainable ones
  // zero_stage 1 or 2, and 3 with a dist kvstore: this rank's chunks and their layout over its group
  // (a group of one for the devices of one process) (else null).
  const zero::RankShards* rank_shards() const;
  // Whether a state given to load_state_dict waits for the next step to be placed (then the shards,
  // shards() and rank_shards(), still hold the old one; state_dict() has the loaded one).
  bool loaded_state_waiting() const;

  // What a checkpoint needs to continue bit for bit: "<slot>/<parameter name>" per slot of
  // state_names() and trainable parameter (device 0's replica; all replicas are equal; with
  // zero_stage 1 or 2 gathered from the shards, so a checkpoint does not depend on the device count;
  // over the processes gathered from every rank: every rank calls it and gets the whole state) and
  // "num_update", "learning_rate" (one value each). load_state_dict checks names and shapes and
  // names what is wrong. SGD's momentum is MXNet's (lr already folded in, see above); num_update is
  // exact up to 2^24 (Adam's step t is num_update + 1).
  std::map<std::string, HostTensor> state_dict() const;
  void load_state_dict(const std::map<std::string, HostTensor>& state);

 private:
  bool run_step(int64_t batch_size, float loss_scale, bool check_finite);
  // fully_shard's input: every parameter's replicas and its name.
  std::pair<std::vector<std::vector<Tensor>>, std::vector<std::string>> weights_to_shard() const;

  std::vector<std::pair<std::string, nn::ParameterPtr>> params_;  // trainable ones, in order
  std::string optimizer_;
  OptimizerOptions options_;
  std::unique_ptr<KVStore> kv_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<std::vector<Tensor>>> state_;  // per parameter, per slot, per replica
  // Per parameter and slot, the state in host memory: the state itself when the kvstore updates on
  // the host ('local'), otherwise values loaded by load_state_dict waiting for the next step to place them.
  std::vector<std::vector<std::vector<float>>> host_state_;
  // Puts parameter k's state where the kvstore wants it for these replicas (zeros at first).
  void place_state(size_t k, const std::vector<Tensor>& weights);
  // zero_stage 1 to 3: the shards, over the devices of this process or over the ranks (null at stage 0).
  std::unique_ptr<zero::Shards> zero_;
  bool over_ranks_ = false;  // the shards are the ranks of the dp group (not one process's devices)
  int64_t num_update_ = 0;
  float last_grad_norm_;  // NaN until a step with clip_grad_norm
};

}  // namespace d2l::optim
