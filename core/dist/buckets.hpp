// Gradient buckets, PyTorch DDP's design (Li et al., VLDB 2020; README.md "Processes and
// machines"; chapter 4). The parameters are grouped in reverse registration order (backward produces
// the last layer's gradients first) into buckets of up to bucket_mb megabytes. An autograd hook
// (core/autograd.hpp's gradient-ready hooks) counts the gradients as backward completes them; the
// moment a bucket's last gradient has been enqueued, its gradients are packed into one flat buffer
// and its allreduce is enqueued on the communication thread, ordered after the packing by an event:
// the host never waits, and the allreduce runs while backward goes on computing earlier layers.
// Buckets are launched strictly in bucket order (a ready bucket waits for the ones before it), so
// every rank issues the same collectives in the same order whatever order its gradients arrive in.
// finish() launches what is left, makes each device's compute stream wait for the buckets, and
// unpacks: every replica's gradient becomes the sum over every device of every rank.
//
//   dist::Buckets buckets(replicas, {25, "library", true});   // before the first backward
//   loss.backward();                                          // buckets launch as they fill
//   buckets.finish();                                         // then the optimizer step
//
// Gradient accumulation (several backward() calls before finish(), without no_sync) gives the sum
// over every backward: a bucket packed before more gradient arrived is launched again by finish()
// (buckets.cpp, on_grad_ready), as is one packed before a weight gradient that zb-h1 deferred. Every
// rank must run as many backward passes per step (as in PyTorch's DDP); no_sync avoids the wasted
// first launches.
// bucket_mb 0: one bucket per parameter. A bucket larger than the model: one flat allreduce, which
// can only start when backward is done. overlap false: every bucket waits for finish() (the
// "allreduce after backward" of chapter 1). comm_type bf16 or f16: DDP's compression hooks (below).
// With several devices in a process, a parameter is ready
// when its gradient on every device is; the devices' gradients are summed on the first device first.
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/dist/collectives.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::dist {

struct BucketOptions {
  double bucket_mb = 25;               // PyTorch's default bucket_cap_mb
  std::string algorithm = "library";   // the allreduce: library, ring or naive
  bool overlap = true;                 // launch buckets during backward (false: all in finish())
  // DDP's communication hook: the type a bucket travels in. f32 is PyTorch's default allreduce_hook;
  // bf16 and f16 are its bf16_compress_hook and fp16_compress_hook: the packed float32 gradients are
  // rounded to 16 bits, summed in 16 bits (half the bytes on the wire, each addition rounded back),
  // and widened into the float32 gradients again. The sum is not divided by the world size first
  // (PyTorch's hooks average; these buckets sum): a float16 sum beyond 65504 becomes infinity, which
  // fp16's loss scaling then finds and skips.
  DType comm_type = DType::f32;
};
// The hooks' names as PyTorch spells them, and back: "allreduce" f32, "bf16_compress" bf16,
// "fp16_compress" f16; another name is a ConfigError that names `flag` and the choices.
const char* comm_hook_name(DType comm_type);
DType comm_hook_type(const std::string& flag, const std::string& name);

class Buckets : NoCopy {
 public:
  // replicas[k]: parameter k, in registration order, on each of this process's devices (the same
  // device order for every k). Their gradients (.grad()) are what gets summed.
  Buckets(std::vector<std::vector<Tensor>> replicas, BucketOptions options);
  ~Buckets();

  // Launches the buckets not launched yet, in order; then every replica's gradient holds the sum
  // over all devices and ranks (stream-ordered: the host does not wait). Resets for the next step.
  void finish();

  // DDP's no_sync(): while a NoSync lives, backward launches nothing and gradients accumulate on
  // each device; the first backward after it (followed by finish()) reduces the accumulated sum.
  class NoSync : NoCopy {
   public:
    explicit NoSync(Buckets& b);
    ~NoSync();

   private:
    Buckets& b_;
  };

  struct Bucket {
    std::vector<size_t> params;  // parameter indices, in the order they are packed
    int64_t numel = 0;
    Tensor flat;                 // numel floats on the first device, reused every step
    Tensor wire;                 // comm_type bf16 / f16: flat rounded to 16 bits, what the allreduce sums
  };
  const std::vector<Bucket>& buckets() const { return buckets_; }
  const BucketOptions& options() const { return options_; }
  // What happened in the last step (kept until the next one starts), for tests and the chapter:
  // the parameters in the order their gradients became ready, and the buckets in launch order,
  // each with whether it was launched during backward (true) or by finish() (false).
  std::vector<size_t> ready_order() const;
  std::vector<std::pair<size_t, bool>> launch_order() const;
  // Whether these are still the tensors the buckets were built for (a parameter moved: rebuild).
  bool same_replicas(const std::vector<std::vector<Tensor>>& replicas) const;

 private:
  void on_grad_ready(TensorImpl& leaf);
  void launch(size_t b, bool during_backward);  // mu_ held
  void launch_ready();                          // mu_ held: every ready bucket at the front
  void start_step_if_new();                     // mu_ held

  std::vector<std::vector<Tensor>> replicas_;
  BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;               // per parameter
  std::unordered_map<TensorImpl*, size_t> param_of_;
  int hook_ = -1;

  mutable std::mutex mu_;
  bool in_step_ = false, sync_ = true;
  bool accumulating_ = false;                   // a parameter reported twice this step: launch in finish()
  std::vector<int> hits_;                       // per parameter, this step: its replicas' ready reports
  std::vector<size_t> params_missing_;          // per bucket, this step
  std::vector<Work> work_;                      // per bucket
  std::vector<bool> launched_;
  std::vector<bool> stale_;                     // per bucket: packed before more gradient arrived
  size_t next_ = 0;                             // the next bucket to launch
  std::vector<size_t> ready_log_;
  std::vector<std::pair<size_t, bool>> launch_log_;
};

}  // namespace d2l::dist
