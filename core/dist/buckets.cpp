#include "core/dist/buckets.hpp"

#include <algorithm>
#include <cstdio>
#include <stdexcept>

#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/trace.hpp"

namespace d2l::dist {

namespace {

std::string mb(double bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MB", bytes / 1e6);
  return buf;
}

}  // namespace

const char* comm_hook_name(DType comm_type) {
  return comm_type == DType::bf16 ? "bf16_compress" : comm_type == DType::f16 ? "fp16_compress" : "allreduce";
}

DType comm_hook_type(const std::string& flag, const std::string& name) {
  for (DType t : {DType::f32, DType::bf16, DType::f16})
    if (name == comm_hook_name(t)) return t;
  throw ConfigError("bad " + flag + " '" + name + "': expected allreduce (float32), bf16_compress or fp16_compress "
                    "(the gradients summed in bfloat16 or float16: half the bytes)");
}

Buckets::Buckets(std::vector<std::vector<Tensor>> replicas, BucketOptions options)
    : replicas_(std::move(replicas)), options_(std::move(options)) {
  check_algorithm("bucket allreduce algorithm", options_.algorithm);
  if (!(options_.bucket_mb >= 0)) throw ConfigError("bad --bucket-mb: must be >= 0 (0: one bucket per parameter)");
  if (!is_float(options_.comm_type)) throw ConfigError("dist::Buckets: the communication type must be float32, bfloat16 or float16");
  if (replicas_.empty()) throw ShapeError("dist::Buckets: no parameters");
  const size_t devices = replicas_[0].size();
  for (size_t k = 0; k < replicas_.size(); ++k) {
    if (replicas_[k].size() != devices || devices == 0)
      throw ShapeError("dist::Buckets: every parameter needs one replica per device (" + std::to_string(devices) + ")");
    for (size_t i = 0; i < devices; ++i) {
      const Tensor& t = replicas_[k][i];
      if (!t.defined() || t.dtype() != DType::f32 || t.shape() != replicas_[k][0].shape() ||
          t.device() != replicas_[0][i].device())
        throw ShapeError("dist::Buckets: parameter " + std::to_string(k) + "'s replicas must be float32 tensors of one "
                         "shape on the same devices as the other parameters'");
      param_of_[&t.impl()] = k;
    }
  }
  // Reverse registration order, filled up to the cap; a parameter larger than the cap is alone.
  const double cap = options_.bucket_mb * 1e6;
  bucket_of_.assign(replicas_.size(), 0);
  for (size_t j = replicas_.size(); j-- > 0;) {
    const double bytes = 4.0 * static_cast<double>(replicas_[j][0].numel());
    if (buckets_.empty() || (4.0 * static_cast<double>(buckets_.back().numel) + bytes > cap))
      buckets_.push_back(Bucket{});
    buckets_.back().params.push_back(j);
    buckets_.back().numel += replicas_[j][0].numel();
    bucket_of_[j] = buckets_.size() - 1;
  }
  const Device first = replicas_[0][0].device();
  for (auto& b : buckets_) b.flat = Tensor::zeros({b.numel}, first);
  work_.resize(buckets_.size());
  launched_.assign(buckets_.size(), false);
  hook_ = add_grad_ready_hook([this](TensorImpl& leaf) { on_grad_ready(leaf); });
}

Buckets::~Buckets() { remove_grad_ready_hook(hook_); }

bool Buckets::same_replicas(const std::vector<std::vector<Tensor>>& replicas) const {
  if (replicas.size() != replicas_.size()) return false;
  for (size_t k = 0; k < replicas.size(); ++k) {
    if (replicas[k].size() != replicas_[k].size()) return false;
    for (size_t i = 0; i < replicas[k].size(); ++i)
      if (!replicas[k][i].same(replicas_[k][i])) return false;
  }
  return true;
}

void Buckets::start_step_if_new() {
  if (in_step_) return;
  in_step_ = true;
  accumulating_ = false;
  hits_.assign(replicas_.size(), 0);
  params_missing_.assign(buckets_.size(), 0);
  for (size_t b = 0; b < buckets_.size(); ++b) params_missing_[b] = buckets_[b].params.size();
  launched_.assign(buckets_.size(), false);
  stale_.assign(buckets_.size(), false);
  next_ = 0;
  ready_log_.clear();
  launch_log_.clear();
}

// One ready per replica per parameter is a step's expectation: the parameter is ready when all its
// replicas have reported. A report beyond that is more gradient for a parameter already counted: a
// second backward() in the step without no_sync (gradient accumulation), a loss whose graph also
// reaches another device's replicas (SyncBatchNorm's shared statistics), or a weight gradient that
// zb-h1 deferred to its W. What was packed before it is stale: from then on nothing launches during
// backward, and finish() launches the stale buckets again with the accumulated sums, so the reduced
// gradient is always the sum over every backward, device and rank. Every rank runs the same program,
// so every rank relaunches the same buckets, in bucket order.
void Buckets::on_grad_ready(TensorImpl& leaf) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = param_of_.find(&leaf);
  if (it == param_of_.end() || !sync_) return;  // not ours, or no_sync: accumulate only
  start_step_if_new();
  const size_t k = it->second, b = bucket_of_[k];
  const int hits = ++hits_[k], expected = static_cast<int>(replicas_[k].size());
  if (hits < expected) return;  // another device still to come
  if (hits > expected) {
    accumulating_ = true;
    if (launched_[b]) stale_[b] = true;
    return;
  }
  ready_log_.push_back(k);
  if (--params_missing_[b] == 0 && options_.overlap && !accumulating_) launch_ready();
}

void Buckets::launch_ready() {
  while (next_ < buckets_.size() && params_missing_[next_] == 0) launch(next_, true);
}

// Packs bucket b's gradients (each summed over this process's devices on the first one; the
// replicas' own gradients are left as they are until finish()) into its flat buffer and starts its
// allreduce; nothing here waits.
void Buckets::launch(size_t b, bool during_backward) {
  NoGrad no_grad;
  Bucket& bucket = buckets_[b];
  const Device first = bucket.flat.device();
  if (launched_[b]) work_[b].wait();  // a relaunch: the packing waits for the first collective on flat
  const double wire_bytes = static_cast<double>(dtype_size(options_.comm_type)) * static_cast<double>(bucket.numel);
  trace::Label label("bucket " + std::to_string(b) + " (" + mb(wire_bytes) + ")", static_cast<int64_t>(b));
  size_t offset = 0;
  for (size_t k : bucket.params) {
    Tensor g;
    for (const Tensor& replica : replicas_[k]) {
      Tensor gi = replica.grad();
      if (gi.defined()) g = g.defined() ? add(g, gi.to(first)) : gi.to(first);
    }
    if (!g.defined()) g = Tensor::zeros(replicas_[k][0].shape(), first);  // never used by the forward pass
    const size_t bytes = 4 * static_cast<size_t>(replicas_[k][0].numel());
    copy_bytes(g, 0, bucket.flat, offset, bytes);
    offset += bytes;
  }
  if (options_.comm_type != DType::f32) {
    bucket.wire = cast(bucket.flat, options_.comm_type);  // the compression hook: rounded to 16 bits
    work_[b] = allreduce_async(bucket.wire, options_.algorithm);
  } else {
    work_[b] = allreduce_async(bucket.flat, options_.algorithm);
  }
  launched_[b] = true;
  stale_[b] = false;
  launch_log_.push_back({b, during_backward});
  next_ = std::max(next_, b + 1);
}

void Buckets::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!sync_) throw std::logic_error("dist::Buckets::finish() inside no_sync: the gradients are not to be reduced yet");
  start_step_if_new();
  for (size_t b = 0; b < buckets_.size(); ++b)
    if (!launched_[b] || stale_[b]) launch(b, false);
  NoGrad no_grad;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    work_[b].wait();  // the first device's compute stream waits for the collective
    if (bucket.wire.defined()) cast(bucket.wire, DType::f32).copyto(bucket.flat);  // widened back, exactly
    size_t offset = 0;
    for (size_t k : bucket.params) {
      const size_t bytes = 4 * static_cast<size_t>(replicas_[k][0].numel());
      Tensor g = replicas_[k][0].grad();
      if (g.defined()) {
        copy_bytes(bucket.flat, offset, g, 0, bytes);
        for (size_t i = 1; i < replicas_[k].size(); ++i) {
          Tensor gi = replicas_[k][i].grad();
          if (gi.defined()) g.copyto(gi);
        }
      }
      offset += bytes;
    }
  }
  in_step_ = false;
}

std::vector<size_t> Buckets::ready_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return ready_log_;
}

std::vector<std::pair<size_t, bool>> Buckets::launch_order() const {
  std::lock_guard<std::mutex> lock(mu_);
  return launch_log_;
}

Buckets::NoSync::NoSync(Buckets& b) : b_(b) {
  std::lock_guard<std::mutex> lock(b_.mu_);
  if (b_.in_step_) throw std::logic_error("dist::Buckets::NoSync: a step's buckets are already launching");
  b_.sync_ = false;
}

Buckets::NoSync::~NoSync() {
  std::lock_guard<std::mutex> lock(b_.mu_);
  b_.sync_ = true;
}

}  // namespace d2l::dist
