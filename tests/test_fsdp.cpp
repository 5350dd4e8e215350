// ZeRO stage 3 (core/optim/fsdp.hpp, core/optim/zero.hpp; the Trainer's zero_stage 3): an MLP of
// three units (and a Flatten without parameters) trained 20 steps with its parameters sharded equals
// the same devices' run with everything replicated (SGD with momentum and Adam; 1, 2 and 4 CPU
// devices, 2 emulated GPUs; with and without prefetch); the gathered replicas are the same bits on
// every device; between the units' uses no replica holds memory; the bytes each device keeps
// against 16 Psi'_i (Adam; Psi'_i device i's shard of each unit, added up), the peak the allocator
// measured falling as the device count grows, and the bytes a step moves against 3(N-1) * 4 Psi;
// gradient accumulation; state_dict in the unsharded layout; clip_grad_norm over the shards; the
// errors. tests/mutants runs this file against a zero.cpp and a zero_fsdp.cpp with a mechanism
// broken (the last step's sums kept, a gather that skips the other devices' parts, the norm of
// device 0's parts only): each must fail.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "check.hpp"
#include "one_line_error.hpp"
#include "grad_norm.hpp"
#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/trainer.hpp"
#include "core/optim/zero.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

// (2, 3) images -> flatten -> 6 -> 7 (relu) -> 5 (relu) -> 3: three units, P = 6*7 + 7 + 7*5 + 5 + 5*3 + 3
// = 107 elements, which 2 and 4 do not divide: shards of unequal size, parameters straddling them.
constexpr int64_t kIn = 6, kP = 6 * 7 + 7 + 7 * 5 + 5 + 5 * 3 + 3;
constexpr int64_t kBatch = 9;  // 5/4 over 2 devices, 3/2/2/2 over 4

std::shared_ptr<Sequential> mlp(int64_t in, int64_t h1, int64_t h2, int64_t out) {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Flatten>(), std::make_shared<Dense>(h1, "relu", true, in),
           std::make_shared<Dense>(h2, "relu", true, h1), std::make_shared<Dense>(out, "", true, h2));
  return net;
}

// The tests' MLP, mlp(kIn, 7, 5, 3), from seed `seed`: initialised (Xavier) on `devices`.
std::shared_ptr<Sequential> seeded_mlp(uint64_t seed, const std::vector<Device>& devices) {
  manual_seed(seed);
  auto net = mlp(kIn, 7, 5, 3);
  net->initialize(Init::Xavier(), devices);
  return net;
}

struct Run {
  std::string optimizer = "sgd";
  OptimizerOptions opt{.learning_rate = 0.1f, .momentum = 0.9f, .wd = 1e-3f};
  int steps = 20;
  bool prefetch = true;
  int passes = 1;  // backward passes per step (gradient accumulation)
};

Run adam() { return Run{"adam", {.learning_rate = 0.01f, .wd = 1e-3f}}; }

std::vector<Device> cpus(int n) {
  std::vector<Device> out;
  for (int i = 0; i < n; ++i) out.push_back(cpu(i));
  return out;
}

// Step s, pass p: a batch from an LCG, labels from the features' signs; one loss per device.
void forward_backward(const std::function<std::vector<Tensor>(const std::vector<Tensor>&)>& net, int s, int p,
                      const std::vector<Device>& devices) {
  auto X = test::lcg_data(kBatch * kIn, static_cast<uint32_t>(700 + 31 * s + p));
  std::vector<int32_t> y;
  for (int64_t i = 0; i < kBatch; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  auto Xs = split_and_load(X, {kBatch, 2, 3}, devices, false);
  auto ys = split_and_load(y, {kBatch}, devices, false);
  auto outs = net(Xs);
  std::vector<Tensor> losses;
  for (size_t i = 0; i < outs.size(); ++i) losses.push_back(softmax_cross_entropy(outs[i], ys[i], Reduction::sum));
  for (auto& l : losses) l.backward();
}

using Params = std::vector<std::vector<float>>;  // per trainable parameter, flattened

struct Result {
  Params params;
  std::vector<DeviceMemory> memory;
  std::map<std::string, HostTensor> state;
  // With clip_grad_norm: last_grad_norm() after every step and, replicated, the norm of the summed
  // gradient / batch computed here in double from every replica's .grad before the step.
  std::vector<double> norms, reference;
};

// The replicated run (stage 0, `device` kvstore, net(Xs)) or the sharded one (stage 3 through FSDP).
Result train(const Run& r, const std::vector<Device>& devices, int stage) {
  auto net = seeded_mlp(7, devices);
  OptimizerOptions o = r.opt;
  o.zero_stage = stage;
  Trainer trainer(net->collect_params(), r.optimizer, o, "device");
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer, FsdpOptions{r.prefetch});
  auto run = [&](const std::vector<Tensor>& xs) { return fsdp ? (*fsdp)(xs) : (*net)(xs); };
  bool released = true;
  Result out;
  for (int s = 0; s < r.steps; ++s) {
    for (int p = 0; p < r.passes; ++p) forward_backward(run, s, p, devices);
    if (r.opt.clip_grad_norm > 0 && stage == 0)
      out.reference.push_back(test::summed_gradient_norm(net->collect_params(), kBatch * r.passes));
    trainer.step(kBatch * r.passes);
    out.norms.push_back(trainer.last_grad_norm());
    if (stage == 3)
      for (size_t k = 0; k < trainer.num_parameters(); ++k)
        for (size_t i = 0; i < devices.size(); ++i) released = released && !trainer.shards()->gathered(k, i);
  }
  CHECK_MESSAGE(released, "a replica still holds memory after a step");
  if (stage == 3) {
    out.params = trainer.shards()->parameters();
  } else {
    for (auto& p : net->collect_params().trainable()) out.params.push_back(p->list_data()[0].to_vector());
  }
  out.memory = trainer.memory_per_device();
  out.state = trainer.state_dict();
  return out;
}

bool close_params(const Params& ref, const Params& got) {
  bool ok = ref.size() == got.size();
  for (size_t k = 0; ok && k < ref.size(); ++k) ok = test::close(ref[k], got[k], 1e-7, 1e-5, "parameter") && ok;
  return ok;
}

void compare(const Run& r, const std::vector<Device>& devices) {
  CAPTURE(r.optimizer);
  CAPTURE(r.prefetch);
  CAPTURE(r.passes);
  CAPTURE(str(devices));
  const Result plain = train(r, devices, 0), sharded = train(r, devices, 3);
  CHECK(close_params(plain.params, sharded.params));
  const std::string how = std::string(r.prefetch ? ", prefetch, " : ", no prefetch, ") + std::to_string(r.passes) +
                          " pass(es) a step: ZeRO-3 and replicated have " +
                          (plain.params == sharded.params ? "the same bits" : "different last bits");
  MESSAGE(r.optimizer << " on " << str(devices) << how);
}

int64_t shard_size(int64_t P, int64_t n, int64_t i) { return P * (i + 1) / n - P * i / n; }

// Psi'_i: each unit is split over the n devices by itself (FSDP's per-unit FlatParameter), so device
// i keeps shard i of each unit's P_u, added up.
int64_t unit_shards(int64_t n, int64_t i) {
  int64_t held = 0;
  for (int64_t p_u : {kIn * 7 + 7, int64_t{7 * 5 + 5}, int64_t{5 * 3 + 3}}) held += shard_size(p_u, n, i);
  return held;
}

}  // namespace

TEST_CASE("ZeRO-3 equals the replicated run over 20 steps: 1, 2 and 4 CPU devices, SGD with momentum and Adam, with and without prefetch") {
  for (int n : {1, 2, 4})
    for (const Run& base : {Run{}, adam()})
      for (bool prefetch : {true, false}) {
        Run r = base;
        r.prefetch = prefetch;
        compare(r, cpus(n));
      }
}

TEST_CASE("clip_grad_norm: ZeRO-3 clips by the norm of the whole summed gradient, as the replicated run, over 20 steps") {
  for (int n : {1, 2, 4})
    for (const Run& base : {Run{}, adam()}) {
      CAPTURE(n);
      CAPTURE(base.optimizer);
      Run loose = base;  // a max_norm above every norm: the unclipped run, bit for bit
      loose.opt.clip_grad_norm = 1e30f;
      CHECK(train(loose, cpus(n), 3).params == train(base, cpus(n), 3).params);
      Run probe = loose;
      probe.steps = 1;
      Run r = base;
      r.opt.clip_grad_norm = static_cast<float>(0.1 * train(probe, cpus(n), 0).norms[0]);  // the steps clip
      const Result plain = train(r, cpus(n), 0), sharded = train(r, cpus(n), 3);
      CHECK(plain.norms[0] > 5 * r.opt.clip_grad_norm);
      CHECK(test::close(plain.reference, plain.norms, 0, 1e-5, "replicated norm"));
      CHECK(test::close(plain.reference, sharded.norms, 0, 1e-5, "ZeRO-3 norm"));
      CHECK(close_params(plain.params, sharded.params));
      CHECK(plain.params != train(base, cpus(n), 0).params);  // clipping changed the run
      if (n == 1) CHECK(plain.params == sharded.params);
      MESSAGE(base.optimizer << " clipped on " << n << " device(s): ZeRO-3 and replicated have "
                             << std::string(plain.params == sharded.params ? "the same bits" : "different last bits"));
    }
}

TEST_CASE("ZeRO-3 on two emulated GPUs equals the replicated run, SGD with momentum and Adam") {
  compare(Run{}, {emu(0), emu(1)});
  compare(adam(), {emu(0), emu(1)});
}

TEST_CASE("ZeRO-3 with gradient accumulation: two backward passes a step add into the shards") {
  Run r = adam();
  r.passes = 2;
  r.steps = 8;
  compare(r, cpus(2));
  compare(r, cpus(3));
}

TEST_CASE("ZeRO-3 between steps: parameters 4 Psi'_i, summed gradient 4 Psi'_i, Adam's state 8 Psi'_i, no .grad buffers") {
  for (int n : {1, 2, 4}) {
    CAPTURE(n);
    Run r = adam();
    r.steps = 2;
    const Result res = train(r, cpus(n), 3);
    REQUIRE(res.memory.size() == static_cast<size_t>(n));
    int64_t params = 0, state = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t s = unit_shards(n, i);
      CHECK(res.memory[i].device == cpu(i));
      CHECK(res.memory[i].parameter_bytes == 4 * s);
      CHECK(res.memory[i].gradient_bytes == 0);
      CHECK(res.memory[i].summed_gradient_bytes == 4 * s);
      CHECK(res.memory[i].state_bytes == 8 * s);
      params += res.memory[i].parameter_bytes;
      state += res.memory[i].state_bytes;
    }
    CHECK(params == 4 * kP);  // the shards add up to one copy
    CHECK(state == 8 * kP);
  }
}

TEST_CASE("ZeRO-3: the gathered replicas are the same bits on every device, and the shards' values") {
  const auto devices = cpus(4);
  auto net = seeded_mlp(3, devices);
  Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = 3});
  FullyShardedDataParallel fsdp(net, trainer);
  auto run = [&](const std::vector<Tensor>& xs) { return fsdp(xs); };
  for (int s = 0; s < 3; ++s) {
    forward_backward(run, s, 0, devices);
    trainer.step(kBatch);
  }
  const Params shards = trainer.shards()->parameters();
  auto params = net->collect_params().trainable();
  {
    FullyShardedDataParallel::FullParameters whole(fsdp);
    for (size_t k = 0; k < params.size(); ++k)
      for (auto& replica : params[k]->list_data()) CHECK(replica.to_vector() == shards[k]);
  }
  // Outside the scope the replicas have no memory: reading one is a one-line error.
  try {
    params[0]->data(cpu(1)).to_vector();
    FAIL("a released replica was read");
  } catch (const std::logic_error& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    CHECK_MESSAGE(what.find("whole only inside FullyShardedDataParallel's forward and backward") != std::string::npos, what);
  }
}

TEST_CASE("ZeRO-3: no replica holds memory after the forward; the peak the allocator measures falls as N grows") {
  // Eight units of 128 x 128 and a small batch: the parameters, not the activations, fill the memory.
  auto peak_of = [](int stage, int n) {
    const auto devices = cpus(n);
    manual_seed(5);
    auto net = std::make_shared<Sequential>();
    for (int l = 0; l < 8; ++l) net->add(std::make_shared<Dense>(128, l < 7 ? "relu" : "", true, 128));
    net->initialize(Init::Xavier(), devices);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = stage});
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer);
    int64_t peak = 0;
    for (int s = 0; s < 3; ++s) {
      waitall();
      for (auto& d : devices) runtime(d).allocator->reset_peak();
      auto X = test::lcg_data(8 * 128, static_cast<uint32_t>(s));
      auto Xs = split_and_load(X, {8, 128}, devices, false);
      auto outs = fsdp ? (*fsdp)(Xs) : (*net)(Xs);
      if (fsdp)  // between the forward and the backward no replica holds memory
        for (size_t k = 0; k < trainer.num_parameters(); ++k)
          for (size_t i = 0; i < devices.size(); ++i) CHECK(!trainer.shards()->gathered(k, i));
      for (auto& o : outs) sum(o).backward();
      trainer.step(8);
      waitall();
      for (auto& d : devices) peak = std::max(peak, runtime(d).allocator->stats().peak);
    }
    return peak;
  };
  const int64_t replicated = peak_of(0, 4);
  const int64_t p1 = peak_of(3, 1), p2 = peak_of(3, 2), p4 = peak_of(3, 4);
  MESSAGE("peak bytes a device, Adam: replicated at N=4 " << replicated << "; ZeRO-3 at N=1 " << p1 << ", N=2 " << p2
                                                          << ", N=4 " << p4);
  CHECK(p2 < p1);
  CHECK(p4 < p2);
  CHECK(p4 < replicated / 2);
}

TEST_CASE("ZeRO-3: a step moves 3(N-1) * 4 Psi bytes between devices: the forward's and the backward's all-gathers and the reduce-scatter") {
  for (int n : {2, 4}) {
    CAPTURE(n);
    const auto devices = cpus(n);
    auto net = seeded_mlp(9, devices);
    Trainer trainer(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3});
    FullyShardedDataParallel fsdp(net, trainer);
    auto run = [&](const std::vector<Tensor>& xs) { return fsdp(xs); };
    forward_backward(run, 0, 0, devices);  // the batch's own copies (split_and_load) come first
    trainer.step(kBatch);
    waitall();
    // The batch is loaded from the host, which the counters do not count.
    reset_copy_counters();
    forward_backward(run, 1, 0, devices);
    trainer.step(kBatch);
    waitall();
    int64_t sent = 0;
    for (int i = 0; i < n; ++i) {
      const int64_t out = copy_counters(cpu(i)).bytes_out;
      // Device i sends its shard to every other device twice and receives the rest of every gradient.
      CHECK(out == 4 * (2 * (n - 1) * unit_shards(n, i) + (kP - unit_shards(n, i))));
      sent += out;
    }
    CHECK(sent == 3 * (n - 1) * 4 * kP);
  }
}

TEST_CASE("ZeRO-3 state_dict is the unsharded state: equal to the replicated run's") {
  Run r = adam();
  r.steps = 5;
  const Result plain = train(r, cpus(1), 0), sharded = train(r, cpus(4), 3);
  REQUIRE(plain.state.size() == sharded.state.size());
  for (auto& [key, t] : plain.state) {
    CAPTURE(key);
    REQUIRE(sharded.state.count(key));
    CHECK(sharded.state.at(key).shape == t.shape);
    CHECK(test::close(t.values, sharded.state.at(key).values, 1e-7, 1e-5, key.c_str()));
  }
}

TEST_CASE("ZeRO-3 errors are one line: another stage, the net run without FSDP, shards on other devices, parameters moved") {
  auto one_line = [](auto&& make, const std::string& expected) { test::check_one_line_error(make, expected); };
  const auto devices = cpus(2);
  auto net = mlp(kIn, 7, 5, 3);
  net->initialize(Init::Xavier(), devices);
  {
    Trainer t(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 2});
    one_line([&] { FullyShardedDataParallel f(net, t); },
             "FullyShardedDataParallel needs a Trainer with zero_stage 3, this one has zero_stage 2");
  }
  {
    Trainer t(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3});
    auto run = [&](const std::vector<Tensor>& xs) { return (*net)(xs); };
    forward_backward(run, 0, 0, devices);  // the replicas are still whole: the plain net runs
    one_line([&] { t.step(kBatch); }, "Trainer: zero_stage 3 shards the parameters themselves: run the net through "
                                      "optim::FullyShardedDataParallel(net, trainer)");
  }
  auto other = mlp(kIn, 7, 5, 3);
  other->initialize(Init::Xavier(), devices);
  {
    Trainer t(other->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3});
    one_line([&] { FullyShardedDataParallel f(net, t); }, "of the net is not one of the trainer's");
  }
  {
    Trainer t(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3});
    FullyShardedDataParallel f(net, t);
    const auto X = Tensor::zeros({3, 2, 3}, cpu(0));
    one_line([&] { f({X}); }, "FullyShardedDataParallel: one shard of the batch per device of the shards, "
                              "[cpu(0), cpu(1)], got shards on [cpu(0)]");
    // The net outside FSDP: its replicas have no memory now.
    one_line([&] { (*net)(X); }, "whole only inside FullyShardedDataParallel's forward and backward");
  }
  {  // the parameters moved after they were sharded: to another device reset_ctx reads a released replica
    auto moved = seeded_mlp(4, devices);
    Trainer t(moved->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3});
    FullyShardedDataParallel f(moved, t);
    auto params = moved->collect_params().trainable();
    one_line([&] { params[0]->reset_ctx({cpu(0), cpu(2)}); }, "whole only inside FullyShardedDataParallel's forward and backward");
    for (auto& p : params) p->reset_ctx({cpu(1), cpu(0)});  // the same devices in another order: the step refuses it
    one_line([&] { t.step(kBatch); }, "Trainer: zero_stage 3 keeps the parameters where they were sharded, [cpu(0), cpu(1)]; "
                                      "they cannot move (reset_ctx) afterwards");
  }
  for (int stage : {4, -1})
    one_line([&] { Trainer(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = stage}); },
             "or 3 (ZeRO-3: parameters sharded too), got " + std::to_string(stage));
}

TEST_CASE("ZeRO-3 opens nested Sequentials: their blocks are units, and the run still equals the replicated one") {
  const auto devices = cpus(2);
  auto build = [] {
    auto inner = std::make_shared<Sequential>();
    inner->add(std::make_shared<Dense>(5, "relu", true, 7), std::make_shared<Dense>(5, "relu", true, 5));
    auto net = std::make_shared<Sequential>();
    net->add(std::make_shared<Flatten>(), std::make_shared<Dense>(7, "relu", true, kIn), inner,
             std::make_shared<Dense>(3, "", true, 5));
    return net;
  };
  std::vector<Params> results;
  for (int mode = 0; mode < 3; ++mode) {  // replicated; ZeRO-3 with the nested blocks as units; without
    manual_seed(11);
    auto net = build();
    net->initialize(Init::Xavier(), devices);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = mode == 0 ? 0 : 3});
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (mode > 0) {
      fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer, FsdpOptions{.prefetch = true, .nested = mode == 1});
      CHECK(fsdp->units().size() == (mode == 1 ? 4u : 3u));
      CHECK(fsdp->units()[1] == std::vector<size_t>(mode == 1 ? std::vector<size_t>{2, 3} : std::vector<size_t>{2, 3, 4, 5}));
    }
    auto run = [&](const std::vector<Tensor>& xs) { return fsdp ? (*fsdp)(xs) : (*net)(xs); };
    for (int s = 0; s < 10; ++s) {
      forward_backward(run, s, 0, devices);
      trainer.step(kBatch);
    }
    Params out;
    if (fsdp) out = trainer.shards()->parameters();
    else
      for (auto& p : net->collect_params().trainable()) out.push_back(p->list_data()[0].to_vector());
    results.push_back(out);
  }
  CHECK(close_params(results[0], results[1]));
  CHECK(close_params(results[0], results[2]));
}
