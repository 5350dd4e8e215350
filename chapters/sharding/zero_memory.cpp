// Part 1, ZeRO stages 1 to 3 (Rajbhandari et al., SC20, section 5: P_os, P_os+g and P_os+g+p). The
// book's data-parallel loop, unchanged: split the minibatch over the devices, one loss and one
// backward per device, then trainer.step. Only the Trainer's zero_stage differs between the runs at
// each N (and at stage 3 the net runs through FullyShardedDataParallel):
//   stage 0  every device keeps Adam's m and v for all Psi parameters: 8 Psi bytes of state each,
//            and the allreduce leaves the whole summed gradient (4 Psi) on every device;
//   stage 1  device i keeps m and v of its shard of Psi_i elements only; after backward the
//            gradients are reduce-scattered (device i receives its shard's sum), it updates its
//            shard, and the updated shards are all-gathered into every replica: 8 Psi_i bytes of
//            state, about 8 Psi / N, and 2(N-1) * 4 Psi bytes sent a step, as the allreduce;
//   stage 2  as stage 1, but the gradients are reduce-scattered during backward, each the moment it
//            is complete, and its .grad buffer released: device i keeps only its shard's summed
//            gradient, 4 Psi_i bytes;
//   stage 3  the parameters are shards too (4 Psi_i a device); each layer is gathered before its
//            forward and its backward and released after, each gradient added into the shards the
//            moment it is complete: 16 Psi_i kept, the peak near that plus a layer or two, and
//            3(N-1) * 4 Psi bytes a step (two all-gathers and a reduce-scatter).
// At stages 0 and 1 the parameters (4 Psi) and the .grad buffers autograd fills (4 Psi) stay on
// every device; at stage 2 the parameters. What each device holds is measured from its allocator's
// tags (core/allocator.hpp) and printed beside this model; the net is an MLP of equal-width layers,
// so that the optimizer's bytes dominate and each stage's peak falls below the one before.
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "chapters/sharding/sharding.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/nn/dense.hpp"
#include "core/nn/flatten.hpp"
#include "core/nn/sequential.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

namespace d2l::sharding {

namespace {

// Every replica of every trainable parameter, in host memory.
std::vector<std::vector<float>> replicas(const nn::Block& net) {
  std::vector<std::vector<float>> out;
  for (auto& p : net.collect_params().trainable())
    for (auto& w : p->list_data()) out.push_back(w.to_vector());
  return out;
}

double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return INFINITY;
    for (size_t e = 0; e < a[k].size(); ++e) d = std::max(d, std::fabs(double(a[k][e]) - double(b[k][e])));
  }
  return d;
}

}  // namespace

// flatten -> Dense(hidden, relu) x layers -> Dense(10): every hidden layer the same width.
std::shared_ptr<nn::Sequential> zero_mlp(int64_t features, const Config& cfg) {
  const int64_t hidden = cfg.zero_hidden;
  const int layers = cfg.zero_layers;
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Flatten>(), std::make_shared<nn::Dense>(hidden, "relu", true, features));
  for (int l = 1; l < layers; ++l) net->add(std::make_shared<nn::Dense>(hidden, "relu", true, hidden));
  net->add(std::make_shared<nn::Dense>(10, "", true, hidden));
  return net;
}

int64_t part_of(int64_t n, int64_t i, int64_t k) { return chunk_begin(n, i + 1, k) - chunk_begin(n, i, k); }

int64_t unit_shard(const nn::Sequential& net, int64_t i, int64_t n) {
  int64_t held = 0;
  for (auto& [name, layer] : net.children()) {
    int64_t psi_u = 0;
    for (auto& p : layer->collect_params().trainable()) psi_u += p->list_data()[0].numel();
    held += part_of(psi_u, i, n);
  }
  return held;
}

std::vector<int> zero_device_counts(size_t available) {
  std::vector<int> ns;
  for (size_t n = 1; n <= available; n *= 2) ns.push_back(static_cast<int>(n));
  if (static_cast<size_t>(ns.back()) != available) ns.push_back(static_cast<int>(available));
  return ns;
}

ZeroResult zero_memory(const Config& cfg) {
  DataIter train_iter(*cfg.train_data, cfg.batch_size, true, cfg.seed);
  int64_t features = 1;
  for (int64_t s : train_iter.data().feature_shape) features *= s;
  ZeroResult result;
  for (int n : zero_device_counts(cfg.devices.size())) {
    const std::vector<Device> devices(cfg.devices.begin(), cfg.devices.begin() + n);
    std::vector<std::vector<float>> replicated;  // stage 0's parameters after its steps
    for (int stage = 0; stage <= cfg.zero_stage; ++stage) {
      // The same initial parameters and the same minibatches for both stages.
      manual_seed(cfg.seed);
      std::vector<MemoryStats> before;  // what the devices held before this run (its bytes are the difference)
      for (auto& d : devices) before.push_back(runtime(d).allocator->stats());
      auto net = zero_mlp(features, cfg);
      net->initialize(Init::Xavier(), devices, /*force_reinit=*/true);
      optim::Trainer trainer(net->collect_params(), "adam", {.learning_rate = cfg.adam_lr, .clip_grad_norm = cfg.clip_grad_norm, .zero_stage = stage}, "device");
      optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
      // Stage 3: FSDP(net) in place of net, as PyTorch wraps a module; the parameters become shards here.
      std::unique_ptr<optim::FullyShardedDataParallel> fsdp;
      if (stage == 3) fsdp = std::make_unique<optim::FullyShardedDataParallel>(net, trainer);
      load_run(cfg, *net, trainer);  // --load: the checkpoint in place of the seed's parameters
      const bool trace_this = !cfg.trace_file.empty() && stage == 3 && n == static_cast<int>(cfg.devices.size());
      ZeroRun run;
      run.n = n, run.stage = stage;
      auto start = std::chrono::steady_clock::now();
      int step = 0;
      // Step 0 warms up (allocations, the state's first placement), untimed; then cfg.steps steps.
      for (int64_t epoch = 0; step <= cfg.steps; ++epoch) {
        for (const Batch& b : train_iter.epoch(epoch)) {
          if (step > cfg.steps) break;
          check_interrupt();
          if (step == 1) {
            waitall(), reset_copy_counters(), start = std::chrono::steady_clock::now();
            for (auto& d : devices) runtime(d).allocator->reset_peak();
          }
          const bool tracing = trace_this && step == cfg.steps;  // the last timed step
          if (tracing) waitall(), trace::start();
          // gpu_Xs = split_and_load(X, ctx); ls = [loss(net(X), y) ...]; for l in ls: l.backward()
          auto [Xs, ys] = nn::split_and_load(b, devices, /*even_split=*/false);
          std::vector<Tensor> ls;
          {
            Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
            std::vector<Tensor> outputs = fsdp ? (*fsdp)(Xs) : (*net)(Xs);
            for (size_t i = 0; i < outputs.size(); ++i) ls.push_back(softmax_cross_entropy(outputs[i], ys[i], Reduction::sum));
            for (auto& l : ls) scaler.scale(l).backward();
          }
          // trainer.step: stages 1 to 3: each device updates its shard (1, 2: then the all-gather)
          const bool stepped = scaler.step(trainer, b.n);
          scaler.update();
          if (tracing) {
            waitall();
            trace::stop();
            trace::write_chrome_json(cfg.trace_file, trace::events());
          }
          double loss = 0;
          for (auto& l : ls) loss += l.item();
          check_loss(loss, stepped, 1, step + 1);
          run.final_loss = loss / static_cast<double>(b.n);
          if (step >= 1 && !stepped) ++run.skipped;  // a timed step the GradScaler skipped
          ++step;
        }
      }
      waitall();
      run.seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / cfg.steps;
      result.psi = 0;
      for (auto& p : net->collect_params().trainable()) result.psi += p->list_data()[0].numel();
      run.trace_tasks = trace_this ? static_cast<int64_t>(trace::events().size()) : 0;
      // Measured: every device's bytes by tag now, between steps, less what it held before the run.
      // The paper's model beside them, float32 Adam (K = 8 bytes of state an element): shard i holds
      // Psi_i = floor(Psi (i+1) / N) - floor(Psi i / N) elements; at stage 3 Psi'_i, shard i of each
      // layer (FSDP's unit), added up.
      for (size_t i = 0; i < devices.size(); ++i) {
        const MemoryStats now = runtime(devices[i]).allocator->stats();
        auto held = [&](MemoryTag t) { return now.held(t) - before[i].held(t); };
        const int64_t shard = stage == 3 ? unit_shard(*net, int64_t(i), n) : part_of(result.psi, int64_t(i), n);
        MemoryRow row{n, stage, devices[i]};
        row.parameter_bytes = held(MemoryTag::parameters);
        row.gradient_bytes = held(MemoryTag::gradients);
        row.summed_gradient_bytes = held(MemoryTag::summed_gradients);
        row.state_bytes = held(MemoryTag::optimizer_state);
        row.gathered_bytes = held(MemoryTag::gathered);
        row.formula_parameter_bytes = 4 * (stage == 3 ? shard : result.psi);
        row.formula_gradient_bytes = stage >= 2 ? 0 : 4 * result.psi;
        row.formula_state_bytes = 8 * (stage == 0 ? result.psi : shard);
        row.formula_summed_gradient_bytes = stage >= 2 ? 4 * shard : 0;
        row.peak_bytes = now.peak;
        std::copy(std::begin(now.at_peak), std::end(now.at_peak), std::begin(row.peak_by_tag));
        row.sent_bytes = copy_counters(devices[i]).bytes_out / cfg.steps;  // counted over the timed steps
        run.sent_bytes += copy_counters(devices[i]).bytes_out;
        run.rows.push_back(row);
      }
      // All devices together: an allreduce sends 2(N-1) Psi floats (the 'device' kvstore's reduce
      // and broadcast, as the ring), a reduce-scatter or an all-gather (N-1) Psi each: stages 1 and
      // 2 one of each; stage 3 all-gathers twice (forward and backward) and reduce-scatters once.
      // A step the GradScaler skipped (fp16) reduces but gathers nothing at stages 1 and 2. Both
      // counted over the timed steps, then divided by them.
      const int64_t skipped_sends = stage == 1 || stage == 2 ? 1 : stage == 3 ? 3 : 2;
      run.formula_sent_bytes =
          ((stage == 3 ? 3 : 2) * (cfg.steps - run.skipped) + skipped_sends * run.skipped) * (n - 1) * 4 * result.psi / cfg.steps;
      run.sent_bytes /= cfg.steps;
      if (stage == 0) {
        replicated = replicas(*net);
      } else if (fsdp) {  // every device's gathered replicas, made whole for the comparison
        optim::FullyShardedDataParallel::FullParameters whole(*fsdp);
        run.max_diff_to_replicated = max_abs_diff(replicas(*net), replicated);
      } else {
        run.max_diff_to_replicated = max_abs_diff(replicas(*net), replicated);
      }
      // --save: the last run, after what it holds is measured.
      if (stage == cfg.zero_stage && n == static_cast<int>(cfg.devices.size())) save_run(cfg, *net, trainer, run);
      result.runs.push_back(run);
    }
  }
  return result;
}

}  // namespace d2l::sharding
