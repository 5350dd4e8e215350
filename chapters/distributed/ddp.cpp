// The DDP experiment (Li et al., VLDB 2020, on chapter 2's ResNet-18): the same training step with
// the gradients reduced seven ways. After backward: one allreduce per parameter, or one flat
// allreduce of all of them. During backward: buckets of 1, 5, 25 and 100 MB, each launched the
// moment its last gradient is ready (core/dist/buckets.hpp), and the 25 MB buckets once more summed
// in bfloat16 (DDP's bf16_compress_hook: half the bytes; --comm-hook puts every variant in 16 bits). Each variant: warm-up steps (the first
// builds the buckets, after it the autograd hooks are armed), then timed steps, each started after a
// barrier and ended when every device and the communication thread are idle; the slowest rank's time
// counts. The last timed step is traced: the fraction of the communication lane's bucket time during
// which the device was running backward kernels is the communication hidden behind backward.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <memory>

#include "chapters/distributed/distributed.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/kvstore.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::distributed {

namespace {

// Total length of the union of intervals.
double union_length(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, a = 0, b = -1;
  for (auto& [s, e] : iv) {
    if (s > b) {
      if (b > a) total += b - a;
      a = s, b = e;
    } else {
      b = std::max(b, e);
    }
  }
  if (b > a) total += b - a;
  return total;
}

Variant variant(std::string name, double mb, bool overlap, DType comm_type) {
  Variant v;
  v.name = std::move(name);
  v.bucket_mb = mb;
  v.overlap = overlap;
  v.comm_type = comm_type;
  return v;
}

std::vector<Variant> variants(const Config& cfg) {
  std::vector<Variant> v;
  v.push_back(variant("per parameter, after backward", 0, false, cfg.comm_type));
  v.push_back(variant("one flat, after backward", 1e6, false, cfg.comm_type));
  char name[64];
  for (double mb : cfg.bucket_mbs) {
    std::snprintf(name, sizeof name, "buckets %g MB, overlapped", mb);
    v.push_back(variant(name, mb, true, cfg.comm_type));
  }
  // DDP's bf16_compress_hook on the traced bucket size: half the bytes (unless every variant has it).
  if (cfg.comm_type == DType::f32) {
    std::snprintf(name, sizeof name, "buckets %g MB, bf16_compress", cfg.bucket_mb);
    v.push_back(variant(name, cfg.bucket_mb, true, DType::bf16));
  }
  return v;
}

}  // namespace

std::pair<double, double> hidden_fraction(const std::vector<trace::Record>& events, Device device) {
  std::vector<std::pair<double, double>> comm, compute, both;
  for (auto& e : events) {
    if (e.stream == "comm" && e.label.rfind("bucket", 0) == 0) comm.emplace_back(e.start_us, e.end_us);
    if (e.stream == "compute" && e.device == device && e.label == "backward") compute.emplace_back(e.start_us, e.end_us);
  }
  const double total = union_length(comm);
  if (total <= 0) return {0, 0};
  // The intersection: each communication interval against the merged compute intervals.
  std::sort(compute.begin(), compute.end());
  for (auto& [cs, ce] : comm)
    for (auto& [s, e] : compute) {
      const double a = std::max(cs, s), b = std::min(ce, e);
      if (b > a) both.emplace_back(a, b);
    }
  return {union_length(both) / total, total * 1e-6};
}

std::vector<Variant> ddp(const Config& cfg, bool model, std::vector<trace::Record>* trace_events) {
  dist::set_link_model(model ? cfg.link : dist::LinkModel{});
  const int steps = cfg.warmup + cfg.repeats;
  // Each rank its own generated images (the timing does not depend on them).
  ArrayDataset data = make_image_classification(cfg.batch * steps, cfg.image, 10, cfg.seed + 1 + static_cast<uint64_t>(dist::rank()));
  DataIter iter(data, cfg.batch, false);
  std::vector<Batch> batches;
  for (const Batch& b : iter.epoch(0)) batches.push_back(b);
  std::vector<Variant> out = variants(cfg);
  for (Variant& v : out) {
    check_interrupt();
    manual_seed(cfg.seed);
    auto net = concise::resnet18(10);
    net->initialize(concise::default_init("resnet18"), cfg.devices, true);
    optim::Trainer trainer(net->collect_params(), "sgd", {0.05f}, "dist_sync");
    optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16's loss scaling
    {  // The shapes first (one image, evaluation mode: nothing changes), so that the buckets exist
       // before step 1 and its backward launches them as every later one does.
      NoGrad no_grad;
      TrainMode eval(false);
      for (Device d : cfg.devices) (*net)(Tensor::zeros({1, 1, cfg.image, cfg.image}, d));
    }
    trainer.set_buckets({v.bucket_mb, "library", v.overlap, v.comm_type});
    for (int s = 0; s < steps; ++s) {
      check_interrupt();
      const bool traced = s == steps - 1;
      waitall();
      dist::barrier();
      if (traced) trace::start();  // every rank's clock starts right after the same barrier
      if (traced) dist::reset_collective_counters();
      auto start = std::chrono::steady_clock::now();
      {
        // concise::train_batch written out, forward and backward labelled so that the trace tells
        // them apart from the buckets' packing and the update.
        nn::BatchShards shards = nn::split_and_load(batches[static_cast<size_t>(s)], cfg.devices, false);
        std::vector<Tensor> losses;
        {
          trace::Label label("forward");
          Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
          std::vector<Tensor> outputs = (*net)(shards.X);
          for (size_t i = 0; i < outputs.size(); ++i) losses.push_back(sum(concise::loss(outputs[i], shards.y[i])));
        }
        {
          trace::Label label("backward");  // the buckets launch from in here
          Autocast mixed(cfg.autocast);
          for (auto& l : losses) scaler.scale(l).backward();
        }
        scaler.step(trainer, batches[static_cast<size_t>(s)].size());  // trainer.step, unless fp16 found an inf
        scaler.update();
      }
      waitall();
      const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (traced) trace::stop();
      if (traced) v.allreduce_bytes = static_cast<double>(dist::collective_counters().allreduce.input_bytes);
      const double slowest = max_over_ranks(t);
      if (s >= cfg.warmup) v.step_seconds.push_back(slowest);
    }
    auto events = trace::events();
    auto [hidden, comm] = hidden_fraction(events, cfg.devices[0]);
    v.hidden = hidden;
    v.comm_seconds = comm;
    // How many buckets: the launches of the traced step.
    v.buckets = static_cast<size_t>(std::count_if(events.begin(), events.end(), [](const trace::Record& e) {
      return e.stream == "comm" && e.label.rfind("bucket", 0) == 0;
    }));
    double sum = 0, sq = 0;
    for (double x : v.step_seconds) sum += x;
    v.mean = sum / static_cast<double>(v.step_seconds.size());
    for (double x : v.step_seconds) sq += (x - v.mean) * (x - v.mean);
    v.std = v.step_seconds.size() > 1 ? std::sqrt(sq / static_cast<double>(v.step_seconds.size() - 1)) : 0;
    if (trace_events && v.overlap && v.bucket_mb == cfg.bucket_mb && v.comm_type == cfg.comm_type) *trace_events = events;
  }
  dist::set_link_model({});
  return out;
}

}  // namespace d2l::distributed
