// What the chapter-2 benchmarks share (resnet18_layer_bench, lab_cnn_epoch_bench): a net of
// chapters/multi_gpu_concise with its Trainer on a list of CPU devices with a given thread count,
// and N training steps of concise::train_batch (or, with --precision bf16, its steps under autocast)
// timed as the book's train() times an epoch (the host enqueues at most two minibatches ahead, then
// waits for every device).
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::bench {

// "1x2": 1 CPU device with 2 kernel threads; "2x1": 2 devices with 1 thread each.
struct Setup {
  const char* key;
  std::vector<Device> devices;
  int threads;
};

struct Model {
  std::shared_ptr<nn::Sequential> net;
  std::unique_ptr<optim::Trainer> trainer;
  std::vector<Device> devices;
};

// The net initialised on the setup's devices (the model's initialiser, seed 0), their thread
// budget set, and an SGD Trainer with the 'device' kvstore.
inline Model make_model(const std::string& model, const Setup& setup, float lr) {
  use_devices(setup.devices);
  for (auto d : setup.devices) runtime(d).set_threads(setup.threads);
  Model m;
  m.devices = setup.devices;
  manual_seed(0);
  m.net = concise::make_net(model);
  m.net->initialize(concise::default_init(model), setup.devices, true);
  m.trainer = std::make_unique<optim::Trainer>(m.net->collect_params(), "sgd", optim::SGDOptions{lr}, "device");
  return m;
}

// Whether to time `setup`: the one --setup names (`only`, or "all"), and no more threads than the
// machine's cores (a line says it is skipped).
inline bool runs(const Setup& setup, const std::string& only) {
  if (only != "all" && only != setup.key) return false;
  if (setup.threads > num_cores()) {
    std::printf("%-6s skipped: %d threads on %d cores\n", setup.key, setup.threads, num_cores());
    return false;
  }
  return true;
}

// n training steps; batch(i) gives the i-th minibatch (host memory). Returns when every device is done.
// autocast bf16: forward and backward under Autocast(DType::bf16), as chapter 2's --precision bf16
// runs them (bfloat16 needs no loss scaler); the step outside the scope.
inline void run_steps(Model& m, int n, const std::function<const Batch&(int)>& batch, DType autocast = DType::f32) {
  std::vector<Event> in_flight(m.devices.size());
  for (int i = 0; i < n; ++i) {
    if (autocast == DType::f32) {
      concise::train_batch(batch(i), *m.net, *m.trainer, m.devices);
    } else {
      const Batch& b = batch(i);
      nn::BatchShards shards = concise::split_and_load(b, m.devices, {});
      {
        Autocast mixed(autocast);
        concise::forward_backward(*m.net, shards.X, shards.y);
      }
      m.trainer->step(b.size());
    }
    for (auto& e : in_flight) e.synchronize();
    for (size_t d = 0; d < m.devices.size(); ++d) runtime(m.devices[d]).compute.record(in_flight[d]);
  }
  waitall();
}

}  // namespace d2l::bench
