// ZeRO stage 3 as PyTorch's FullyShardedDataParallel (Zhao et al., VLDB 2023) runs it, across the
// devices of one process: the net's parameters live only as shards (core/optim/zero.hpp; device i
// keeps shard i of each unit's flat parameter vector), and each layer's replicas are made whole just
// for the moments that need them.
//
//   optim::Trainer trainer(net->collect_params(), "adam", {.learning_rate = 1e-3f, .zero_stage = 3});
//   optim::FullyShardedDataParallel fsdp(net, trainer);   // the parameters become shards here
//   auto outputs = fsdp(Xs);                              // in place of net(Xs)
//   for (auto& l : losses) l.backward();                  // the book's loop, unchanged
//   trainer.step(batch_size);                             // each device updates its shard
//
// Units are the blocks that hold trainable parameters, each with its own parameters, found by
// opening the net and every Sequential inside it (FSDP's auto-wrap by module: a ResNet's residual
// blocks, a Dense layer each); blocks without parameters run as they are. For every unit, in order:
//   forward   gather the unit on every device (an all-gather: each replica receives every shard's
//             part of it), run the unit's forward on each device's shard of the batch, release the
//             replicas again; the unit's output gets an identity node whose backward is the
//             pre-backward hook;
//   backward  the pre-backward hook gathers the unit on that device again, before any of the unit's
//             own backward kernels is queued; the moment a replica's gradient is complete (autograd's
//             gradient-ready hook), its elements are added into the shards that own them and the
//             gradient is released; when the unit's last gradient on a device is done, its
//             parameters there are released too.
// So a device holds its shards plus the whole parameters of about one unit at a time (two with
// prefetch) and the gradients of one unit's backward, never the whole model: the peak falls as the
// device count grows. With prefetch the next unit's gather is queued before the current unit's
// compute (the unit after it in forward, the one before it in backward), as FSDP's forward and
// backward prefetch do.
//
// Gradient accumulation (several backward passes before trainer.step) adds every pass into the
// shards. Under NoGrad (evaluation) the forward gathers and releases and records nothing.
//
// With a Trainer whose kvstore is dist_sync or dist_sync_ring the shards are the ranks instead, one
// device each (core/optim/zero.hpp, the same engine over a group of ranks): the same class and loop, xs holding this rank's one shard
// of the batch; the gathers are dist::allgather of each unit's chunks, and a unit's gradients, once
// all complete, are reduce-scattered over the ranks together.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "core/nn/sequential.hpp"
#include "core/optim/trainer.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::optim {

struct FsdpOptions {
  bool prefetch = true;  // queue the next unit's gather before the current unit's compute
  // Open every Sequential inside the net and take its children as units (a ResNet's stages become
  // their residual blocks); false: the net's own children are the units, whatever they hold.
  bool nested = true;
};

class FullyShardedDataParallel : NoCopy {
 public:
  // The trainer must have zero_stage 3 and hold the net's trainable parameters, all initialised on
  // the same devices; they are sharded here (ConfigError or ParameterError otherwise, in one line).
  FullyShardedDataParallel(std::shared_ptr<nn::Sequential> net, Trainer& trainer, FsdpOptions options = {});
  ~FullyShardedDataParallel();

  // The net on the shards of one batch, xs[i] on device i of the shards' devices (in their order).
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs);
  std::vector<Tensor> operator()(const std::vector<Tensor>& xs) { return forward_shards(xs); }

  // PyTorch's summon_full_params: while a FullParameters lives, every replica is whole (to read
  // or save the parameters; changes made to them are not written back to the shards).
  class FullParameters : NoCopy {
   public:
    explicit FullParameters(FullyShardedDataParallel& f);
    ~FullParameters();

   private:
    FullyShardedDataParallel& f_;
  };

  // The units: per unit, the Trainer's indices of its parameters.
  const std::vector<std::vector<size_t>>& units() const { return units_; }
  const FsdpOptions& options() const { return options_; }

 private:
  std::vector<Tensor> run(const nn::Sequential& seq, std::vector<Tensor> ys, bool recording);
  void pre_backward(size_t u, size_t i);
  void on_grad_ready(TensorImpl& leaf);

  std::shared_ptr<nn::Sequential> net_;
  zero::Shards* shards_ = nullptr;  // over the devices of this process or over the ranks (core/optim/shards.hpp)
  FsdpOptions options_;
  std::unordered_map<const nn::Block*, size_t> unit_of_block_;  // the blocks that are units
  std::vector<std::vector<size_t>> units_;          // per unit: parameter indices
  std::unordered_map<const TensorImpl*, std::pair<size_t, size_t>> replica_;  // -> (parameter, device)
  std::vector<size_t> unit_of_param_;               // per parameter
  std::vector<std::vector<size_t>> pending_;        // [unit][device]: gradients still to come this backward
  int hook_ = -1;
};

}  // namespace d2l::optim
