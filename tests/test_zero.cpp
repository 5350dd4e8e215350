// ZeRO stages 1 and 2 over the devices of one process (core/optim/zero.hpp's zero::RankShards
// over a group of one, the Trainer's zero_stage 1 and 2): a small MLP trained 20 steps with the
// optimizer state sharded (and at stage 2 the gradients reduce-scattered) equals the same devices'
// run with the state replicated, and the two stages equal each other (SGD with momentum and Adam; 2
// and 4 CPU devices, 2 emulated GPUs, one device), every replica bitwise equal after every step; two
// backward passes before a step; the reduce-scatter (core/comm.hpp) against a plain sum; the state
// and summed gradient bytes per device against the formula; the bytes a step moves between devices
// against the formula; state_dict in the unsharded layout, independent of the device count; the
// parameters moved by reset_ctx; clip_grad_norm over the shards against the replicated run and a
// norm computed here; the configuration errors. tests/mutants runs this file against a
// zero.cpp that skips the all-gather or keeps the last step's sums, a shards.cpp that updates
// each shard twice, and a comm.cpp whose reduce-scatter drops the last device's contribution: all
// must fail.
#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "check.hpp"
#include "replicas_equal.hpp"
#include "one_line_error.hpp"
#include "grad_norm.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"
#include "core/optim/zero.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

// 4 -> 5 (relu) -> 3: P = 4*5 + 5 + 5*3 + 3 = 43 trainable elements, a number 2 and 4 do not divide,
// so the shards are uneven and parameters straddle them.
constexpr int64_t kIn = 4, kHidden = 5, kOut = 3, kP = kIn * kHidden + kHidden + kHidden * kOut + kOut;
constexpr int64_t kBatch = 7;  // split 4/3 over 2 devices, 2/2/2/1 over 4

std::shared_ptr<Sequential> small_mlp() {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Dense>(kHidden, "relu", true, kIn), std::make_shared<Dense>(kOut, "", true, kHidden));
  return net;
}

struct Run {
  std::string optimizer = "sgd";
  OptimizerOptions opt{.learning_rate = 0.1f, .momentum = 0.9f, .wd = 1e-3f};
  std::string kvstore = "device";
  int steps = 20;
};

Run adam() { return Run{"adam", {.learning_rate = 0.01f, .wd = 1e-3f}}; }

OptimizerOptions with_stage(OptimizerOptions o, int stage) {
  o.zero_stage = stage;
  return o;
}

using Values = std::map<std::string, std::vector<float>>;

Values values_of(const ParameterDict& params) {
  Values out;
  for (auto& [name, p] : params) out[name] = p->list_data()[0].to_vector();
  return out;
}

using test::replicas_equal;

// Step s's gradients: features from an LCG, labels from their signs; one loss per device, backward.
void forward_backward(Sequential& net, int s, const std::vector<Device>& devices) {
  auto X = test::lcg_data(kBatch * kIn, 500 + s);
  std::vector<int32_t> y;
  for (int64_t i = 0; i < kBatch; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  auto Xs = split_and_load(X, {kBatch, kIn}, devices, false);
  auto ys = split_and_load(y, {kBatch}, devices, false);
  std::vector<Tensor> losses;
  for (size_t i = 0; i < Xs.size(); ++i) losses.push_back(softmax_cross_entropy(net(Xs[i]), ys[i], Reduction::sum));
  for (auto& l : losses) l.backward();
}

void train_step(Sequential& net, Trainer& trainer, int s, const std::vector<Device>& devices) {
  forward_backward(net, s, devices);
  trainer.step(kBatch);
}

std::vector<Device> cpus(int64_t n) {
  std::vector<Device> devices;
  for (int64_t i = 0; i < n; ++i) devices.push_back(cpu(static_cast<int>(i)));
  return devices;
}

// A fresh MLP (seed 42: the same initial values in every run) trained r.steps steps on these
// devices; checks the replicas after every step. Returns the final parameters and the memory report.
std::pair<Values, std::vector<DeviceMemory>> train(const Run& r, const std::vector<Device>& devices, int stage) {
  manual_seed(42);
  auto net = small_mlp();
  net->initialize(Init::Xavier(), devices);
  Trainer trainer(net->collect_params(), r.optimizer, with_stage(r.opt, stage), r.kvstore);
  bool equal = true;
  for (int s = 0; s < r.steps; ++s) {
    train_step(*net, trainer, s, devices);
    equal = equal && replicas_equal(net->collect_params());
  }
  CHECK_MESSAGE(equal, "replicas differ after a step: zero_stage ", stage, ", ", r.optimizer, " on ", str(devices));
  return {values_of(net->collect_params()), trainer.memory_per_device()};
}

bool close_values(const Values& ref, const Values& got, double rtol = 1e-5, double atol = 1e-7) {
  bool ok = ref.size() == got.size();
  for (auto& [name, v] : ref) ok = test::close(v, got.at(name), atol, rtol, name.c_str()) && ok;
  return ok;
}

// ZeRO-1 and ZeRO-2 against the replicated run on the same devices, and against each other;
// returns the stage 2 run's parameters.
Values compare_with_replicated(const Run& r, const std::vector<Device>& devices) {
  CAPTURE(r.optimizer);
  CAPTURE(r.kvstore);
  CAPTURE(str(devices));
  const Values plain = train(r, devices, 0).first, stage1 = train(r, devices, 1).first,
               stage2 = train(r, devices, 2).first;
  CHECK(close_values(plain, stage1));
  CHECK(close_values(plain, stage2));
  CHECK(close_values(stage1, stage2));
  auto same = [](const Values& a, const Values& b) { return std::string(a == b ? "the same bits" : "different last bits"); };
  MESSAGE(r.optimizer << " on " << str(devices) << ": ZeRO-1 and replicated have " << same(plain, stage1)
                      << ", ZeRO-2 and replicated " << same(plain, stage2));
  return stage2;
}

// A run with clip_grad_norm (torch.nn.utils.clip_grad_norm_): the final parameters, last_grad_norm()
// after every step and, at stage 0, summed_gradient_norm() before it.
struct Clipped {
  Values values;
  std::vector<double> norms, reference;
};

Clipped train_clipped(const Run& r, const std::vector<Device>& devices, int stage) {
  manual_seed(42);
  auto net = small_mlp();
  net->initialize(Init::Xavier(), devices);
  Trainer trainer(net->collect_params(), r.optimizer, with_stage(r.opt, stage), r.kvstore);
  CHECK(std::isnan(trainer.last_grad_norm()));  // no clipped step yet
  Clipped out;
  bool equal = true;
  for (int s = 0; s < r.steps; ++s) {
    forward_backward(*net, s, devices);
    if (stage == 0) out.reference.push_back(test::summed_gradient_norm(net->collect_params(), kBatch));
    trainer.step(kBatch);
    out.norms.push_back(trainer.last_grad_norm());
    equal = equal && replicas_equal(net->collect_params());
  }
  CHECK_MESSAGE(equal, "replicas differ after a clipped step: zero_stage ", stage, ", ", r.optimizer, " on ", str(devices));
  out.values = values_of(net->collect_params());
  return out;
}

// Shard i's size for P elements over n devices: floor(P (i+1) / n) - floor(P i / n).
int64_t shard_size(int64_t P, int64_t n, int64_t i) { return P * (i + 1) / n - P * i / n; }

// The bytes of state device i keeps for P elements over n devices with `slots` state tensors an
// element: 4 * slots * its shard's size.
int64_t zero_state_bytes(int64_t slots, int64_t P, int64_t n, int64_t i) { return 4 * slots * shard_size(P, n, i); }

}  // namespace

TEST_CASE("ZeRO-1 and ZeRO-2 on 2 and 4 CPU devices equal the replicated run over 20 steps, SGD with momentum and Adam") {
  manual_seed(42);
  auto fresh = small_mlp();
  fresh->initialize(Init::Xavier(), {cpu(0)});
  const Values start = values_of(fresh->collect_params());
  for (const std::vector<Device>& devices :
       {std::vector<Device>{cpu(0), cpu(1)}, std::vector<Device>{cpu(0), cpu(1), cpu(2), cpu(3)}})
    for (const Run& r : {Run{}, adam()}) {
      const Values got = compare_with_replicated(r, devices);
      // The run learned something: the comparison is not between two untouched nets.
      double moved = 0;
      for (auto& [name, v] : got)
        for (size_t j = 0; j < v.size(); ++j) moved = std::max(moved, double(std::fabs(v[j] - start.at(name)[j])));
      CHECK(moved > 0.05);
    }
  // The ring kvstore sums the gradients instead of 'device' (stage 2 still reduce-scatters in device
  // order): the sharded update runs the same way.
  Run ring;
  ring.kvstore = "ring";
  compare_with_replicated(ring, {cpu(0), cpu(1), cpu(2)});
}

TEST_CASE("ZeRO-1 and ZeRO-2 on two emulated GPUs equal the replicated run over 20 steps, SGD with momentum and Adam") {
  for (const Run& r : {Run{}, adam()}) compare_with_replicated(r, {emu(0), emu(1)});
}

TEST_CASE("ZeRO-1 and ZeRO-2 on one device are the replicated run, bit for bit") {
  for (const Run& r : {Run{}, adam()})
    for (int stage : {1, 2}) {
      CAPTURE(r.optimizer);
      CAPTURE(stage);
      auto [plain, plain_memory] = train(r, {cpu(0)}, 0);
      auto [sharded, sharded_memory] = train(r, {cpu(0)}, stage);
      CHECK(plain == sharded);
      REQUIRE(sharded_memory.size() == 1);
      CHECK(sharded_memory[0].state_bytes == plain_memory[0].state_bytes);
      CHECK(sharded_memory[0].summed_gradient_bytes == 4 * kP);  // one shard holds the whole sum
    }
}

TEST_CASE("clip_grad_norm: ZeRO-1 and ZeRO-2 clip by the norm of the whole summed gradient, as the replicated run, over 20 steps") {
  for (const Run& base : {Run{}, adam()})
    for (int64_t n : {1, 2, 4}) {
      const std::vector<Device> devices = cpus(n);
      CAPTURE(base.optimizer);
      CAPTURE(str(devices));
      // A max_norm above every norm clips nothing: the unclipped run, bit for bit, at every stage.
      Run loose = base;
      loose.opt.clip_grad_norm = 1e30f;
      for (int stage : {0, 1, 2}) CHECK(train(loose, devices, stage).first == train(base, devices, stage).first);
      // max_norm: a tenth of step 1's norm, so that the steps clip.
      Run probe = loose;
      probe.steps = 1;
      Run r = base;
      r.opt.clip_grad_norm = static_cast<float>(0.1 * train_clipped(probe, devices, 0).norms[0]);
      const Clipped plain = train_clipped(r, devices, 0);
      CHECK(test::close(plain.reference, plain.norms, 0, 1e-5, "replicated norm"));
      CHECK(plain.norms[0] > 5 * r.opt.clip_grad_norm);
      CHECK(plain.values != train(base, devices, 0).first);  // clipping changed the run
      for (int stage : {1, 2}) {
        CAPTURE(stage);
        const Clipped sharded = train_clipped(r, devices, stage);
        CHECK(test::close(plain.reference, sharded.norms, 0, 1e-5, "sharded norm"));
        CHECK(close_values(plain.values, sharded.values));
        if (n == 1) CHECK(plain.values == sharded.values);
        MESSAGE(base.optimizer << " clipped on " << str(devices) << ": ZeRO-" << stage << " and replicated have "
                               << std::string(plain.values == sharded.values ? "the same bits" : "different last bits"));
      }
    }
}

TEST_CASE("bytes per device: state 4 * slots * P replicated and 4 * slots * P_i sharded; summed gradient 4 P_i at ZeRO-2") {
  for (int64_t n : {2, 4}) {
    const std::vector<Device> devices = cpus(n);
    for (Run r : {Run{}, adam()}) {
      CAPTURE(n);
      CAPTURE(r.optimizer);
      r.steps = 1;  // the state and the gradient shards exist from the first step on
      const int64_t slots = r.optimizer == "adam" ? 2 : 1;  // SGD: momentum; Adam: m and v
      const auto plain = train(r, devices, 0).second, stage1 = train(r, devices, 1).second,
                 stage2 = train(r, devices, 2).second;
      REQUIRE(plain.size() == devices.size());
      REQUIRE(stage1.size() == devices.size());
      REQUIRE(stage2.size() == devices.size());
      int64_t state_total = 0, gradient_total = 0;
      for (size_t i = 0; i < devices.size(); ++i) {
        CAPTURE(i);
        const int64_t psi_i = shard_size(kP, n, static_cast<int64_t>(i));
        for (const auto* m : {&plain[i], &stage1[i], &stage2[i]}) {
          CHECK(m->device == devices[i]);
          CHECK(m->parameter_bytes == 4 * kP);  // parameters stay replicated up to stage 2
        }
        // The .grad buffers autograd adds into: kept (zeroed) after the step at stages 0 and 1,
        // released at stage 2 once added into the shards.
        CHECK(plain[i].gradient_bytes == 4 * kP);
        CHECK(stage1[i].gradient_bytes == 4 * kP);
        CHECK(stage2[i].gradient_bytes == 0);
        // The paper's formula in float32: K = 4 (SGD's momentum) or 8 (Adam's m and v) bytes an element.
        CHECK(plain[i].state_bytes == 4 * slots * kP);
        CHECK(stage1[i].state_bytes == zero_state_bytes(slots, kP, n, static_cast<int64_t>(i)));
        CHECK(stage2[i].state_bytes == stage1[i].state_bytes);
        // N times smaller, up to the one element the shards differ by.
        CHECK(std::abs(n * stage1[i].state_bytes - plain[i].state_bytes) <= 4 * slots * n);
        // The summed gradient kept after the reduction: the whole 4 P at stages 0 and 1 (in the .grad
        // buffers), the shard's 4 P_i at stage 2, about 4 P / N: the paper's 2 Psi / N in float32.
        CHECK(plain[i].summed_gradient_bytes == 4 * kP);
        CHECK(stage1[i].summed_gradient_bytes == 4 * kP);
        CHECK(stage2[i].summed_gradient_bytes == 4 * psi_i);
        CHECK(std::abs(n * stage2[i].summed_gradient_bytes - 4 * kP) <= 4 * n);
        state_total += stage2[i].state_bytes;
        gradient_total += stage2[i].summed_gradient_bytes;
      }
      CHECK(state_total == plain[0].state_bytes);  // every element's state is kept exactly once
      CHECK(gradient_total == 4 * kP);             // and every element's summed gradient
    }
  }
}

TEST_CASE("ZeRO-2: device i holds the summed gradient of its shard, as the device kvstore adds it, and no .grad buffer outlives backward") {
  for (int64_t n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const std::vector<Device> devices = cpus(n);
    manual_seed(42);
    auto net = small_mlp();
    net->initialize(Init::Xavier(), devices);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = 2});
    forward_backward(*net, 0, devices);
    // The flat vector of summed gradients, added in device order (the parameters in the Trainer's order).
    std::vector<float> sum;
    for (auto& p : net->collect_params().trainable()) {
      std::vector<float> g = p->list_grad()[0].to_vector();
      for (size_t i = 1; i < devices.size(); ++i) {
        const std::vector<float> gi = p->list_grad()[i].to_vector();
        for (size_t e = 0; e < g.size(); ++e) g[e] += gi[e];
      }
      sum.insert(sum.end(), g.begin(), g.end());
    }
    REQUIRE(static_cast<int64_t>(sum.size()) == kP);
    trainer.step(kBatch);  // the first step lays the shards out and adds these gradients in
    const auto* state = trainer.rank_shards();
    REQUIRE(state != nullptr);
    const auto bounds = zero::shard_layout({kP}, devices.size()).bounds;  // device i's piece of the flat vector
    const std::vector<DeviceMemory> held = trainer.memory_per_device();
    REQUIRE(held.size() == devices.size());
    for (size_t i = 0; i < devices.size(); ++i) {
      CAPTURE(i);
      CHECK(held[i].summed_gradient_bytes == 4 * (bounds[i + 1] - bounds[i]));
      CHECK(state->gradient_piece(i) == std::vector<float>(sum.begin() + bounds[i], sum.begin() + bounds[i + 1]));
    }
    // From then on each gradient is added in during backward and its .grad buffer released: after
    // a backward no replica holds one, and the shards hold the new sum.
    for (auto& p : net->collect_params().trainable())
      for (auto& g : p->list_grad()) CHECK(!g.defined());
    forward_backward(*net, 1, devices);
    for (auto& p : net->collect_params().trainable())
      for (auto& g : p->list_grad()) CHECK(!g.defined());
    std::vector<float> expected(static_cast<size_t>(kP), 0.0f);
    {  // the same gradients from a replicated copy of the updated net
      auto copy = small_mlp();
      copy->initialize(Init::Xavier(), devices);
      auto from = net->collect_params().trainable(), to = copy->collect_params().trainable();
      for (size_t k = 0; k < from.size(); ++k) to[k]->set_data(from[k]->list_data()[0]);
      forward_backward(*copy, 1, devices);
      size_t at = 0;
      for (auto& p : copy->collect_params().trainable()) {
        std::vector<float> g = p->list_grad()[0].to_vector();
        for (size_t i = 1; i < devices.size(); ++i) {
          const std::vector<float> gi = p->list_grad()[i].to_vector();
          for (size_t e = 0; e < g.size(); ++e) g[e] += gi[e];
        }
        std::copy(g.begin(), g.end(), expected.begin() + static_cast<int64_t>(at));
        at += g.size();
      }
    }
    for (size_t i = 0; i < devices.size(); ++i)
      CHECK(state->gradient_piece(i) == std::vector<float>(expected.begin() + bounds[i], expected.begin() + bounds[i + 1]));
  }
}

TEST_CASE("gradient accumulation: two backward passes before each step add up at ZeRO-1 and ZeRO-2, as replicated") {
  // Stage 0 and 1 add the second pass into the .grad buffers; stage 2 has released them and adds each
  // device's second gradient into the pieces' sums: the same sum, grouped otherwise.
  for (int64_t n : {1, 3}) {
    CAPTURE(n);
    const std::vector<Device> devices = cpus(n);
    std::vector<Values> runs;
    for (int stage : {0, 1, 2}) {
      CAPTURE(stage);
      manual_seed(42);
      auto net = small_mlp();
      net->initialize(Init::Xavier(), devices);
      Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = stage});
      for (int s = 0; s < 4; ++s) {
        forward_backward(*net, 2 * s, devices);
        forward_backward(*net, 2 * s + 1, devices);
        trainer.step(2 * kBatch);
      }
      CHECK(replicas_equal(net->collect_params()));
      runs.push_back(values_of(net->collect_params()));
    }
    CHECK(runs[1] == runs[0]);  // the same .grad buffers, the same additions
    CHECK(close_values(runs[0], runs[2]));
    // One pass a step instead differs: the test sees the second pass.
    manual_seed(42);
    auto net = small_mlp();
    net->initialize(Init::Xavier(), devices);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = 2});
    for (int s = 0; s < 4; ++s) train_step(*net, trainer, 2 * s, devices);
    CHECK(!close_values(runs[0], values_of(net->collect_params())));
  }
}

TEST_CASE("bytes a step moves between devices: 2(N-1)/N P floats a device at ZeRO-1 and ZeRO-2, as data parallelism") {
  for (int64_t n : {1, 2, 3, 4}) {
    CAPTURE(n);
    const std::vector<Device> devices = cpus(n);
    std::map<int, std::vector<CopyCounters>> moved;  // per stage, per device
    for (int stage : {1, 2}) {
      manual_seed(42);
      auto net = small_mlp();
      net->initialize(Init::Xavier(), devices);
      Trainer trainer(net->collect_params(), "sgd", {.learning_rate = 0.1f, .momentum = 0.9f, .zero_stage = stage});
      train_step(*net, trainer, 0, devices);  // the first step lays the shards out
      waitall();
      reset_copy_counters();  // loading the batch from the host is not counted
      forward_backward(*net, 1, devices);  // stage 2 reduce-scatters during backward
      trainer.step(kBatch);
      waitall();
      for (auto& d : devices) moved[stage].push_back(copy_counters(d));
    }
    int64_t total1 = 0, total2 = 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      CAPTURE(i);
      const int64_t psi_i = shard_size(kP, n, static_cast<int64_t>(i));
      // Device i, stages 1 and 2 alike (stage 1 after backward, stage 2 during it): the reduce-scatter
      // sends the other shards of its gradient (P - P_i) and receives its own shard from n-1
      // devices; the all-gather sends its shard to n-1 devices and receives the other P - P_i
      // elements. In and out: P + (n-2) P_i floats.
      for (int stage : {1, 2}) {
        CAPTURE(stage);
        const CopyCounters& c = moved[stage][i];
        CHECK(c.bytes_out == 4 * (kP + (n - 2) * psi_i));
        CHECK(c.bytes_in == 4 * (kP + (n - 2) * psi_i));
        // The formula, 2(N-1)/N Psi a device, up to the shards' rounding (exact when N divides P).
        CHECK(std::abs(n * c.bytes_out - 4 * 2 * (n - 1) * kP) <= 4 * n * std::max<int64_t>(n - 2, 0));
      }
      total2 += moved[2][i].bytes_out;
      total1 += moved[1][i].bytes_out;
    }
    CHECK(total2 == 4 * 2 * (n - 1) * kP);  // reduce-scatter + all-gather: (n-1) P each
    CHECK(total1 == 4 * 2 * (n - 1) * kP);  // the same at stage 1: the paper's 2 Psi, not an allreduce's 3
  }
}

TEST_CASE("reduce_scatter against a plain sum: shards of unequal size, empty ones, pieces, N = 1 to 4") {
  for (int64_t n : {1, 2, 3, 4}) {
    const std::vector<Device> devices = cpus(n);
    use_devices(devices);
    const int64_t P = 13;
    // the one split rule (sizes differ by at most one), and a skewed cut with an empty shard.
    std::vector<std::vector<int64_t>> cuts{zero::shard_layout({P}, static_cast<size_t>(n)).bounds};
    std::vector<int64_t> skewed{0};
    for (int64_t i = 1; i < n; ++i) skewed.push_back(i == 1 ? 0 : std::min<int64_t>(P, skewed.back() + 2 * i));
    skewed.push_back(P);
    cuts.push_back(skewed);
    for (const auto& bounds : cuts) {
      CAPTURE(n);
      CAPTURE(str(Shape(bounds.begin(), bounds.end())));
      std::vector<std::vector<float>> host;
      std::vector<Tensor> data;
      std::vector<float> sum(P, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        host.push_back(test::lcg_data(P, static_cast<uint32_t>(7 + i)));
        data.push_back(Tensor::from_vector(host.back(), {P}, devices[i]));
        for (int64_t e = 0; e < P; ++e) sum[e] += host.back()[e];  // device order, as reduce_scatter adds
      }
      waitall();
      reset_copy_counters();
      const std::vector<Tensor> out = reduce_scatter(data, bounds);
      waitall();
      REQUIRE(out.size() == devices.size());
      for (int64_t i = 0; i < n; ++i) {
        CAPTURE(i);
        const int64_t size = bounds[i + 1] - bounds[i];
        CHECK(out[i].device() == devices[i]);
        CHECK(out[i].to_vector() == std::vector<float>(sum.begin() + bounds[i], sum.begin() + bounds[i + 1]));
        CHECK(data[i].to_vector() == host[i]);  // the inputs are read, not changed
        CHECK(copy_counters(devices[i]).bytes_in == 4 * (n - 1) * size);
        CHECK(copy_counters(devices[i]).bytes_out == 4 * (P - size));
      }
      // The same vectors given as pieces of 5, 0 and 8 elements that the shards straddle.
      std::vector<std::vector<Tensor>> pieces;
      std::vector<Tensor> out2;
      for (int64_t i = 0; i < n; ++i) {
        auto part = [&](int64_t a, int64_t b) {
          return Tensor::from_vector(std::vector<float>(host[i].begin() + a, host[i].begin() + b), {b - a}, devices[i]);
        };
        pieces.push_back({part(0, 5), part(5, 5), part(5, P)});
        out2.push_back(Tensor::empty({bounds[i + 1] - bounds[i]}, devices[i]));
      }
      reduce_scatter(pieces, bounds, out2);
      for (int64_t i = 0; i < n; ++i) CHECK(out2[i].to_vector() == out[i].to_vector());
    }
  }
  // Bounds that do not cover the data are refused.
  const std::vector<Device> two = cpus(2);
  std::vector<Tensor> data{Tensor::zeros({4}, two[0]), Tensor::zeros({4}, two[1])};
  CHECK_THROWS_AS(reduce_scatter(data, {0, 2, 3}), ShapeError);
  CHECK_THROWS_AS(reduce_scatter(data, {0, 3, 2, 4}), ShapeError);
}

TEST_CASE("the shard layout: contiguous element ranges, floor(P i / N) apart, parameters straddling") {
  const zero::ShardLayout l = zero::shard_layout({20, 5, 15, 3}, 4);  // the MLP's parameters
  CHECK(l.offsets == std::vector<int64_t>{0, 20, 25, 40, 43});
  CHECK(l.bounds == std::vector<int64_t>{0, 10, 21, 32, 43});  // 10, 11, 11, 11
  CHECK(l.total() == kP);
  const zero::ShardLayout tiny = zero::shard_layout({1, 1}, 3);  // more devices than elements
  CHECK(tiny.bounds == std::vector<int64_t>{0, 0, 1, 2});
  CHECK(tiny.shard_size(0) == 0);
  // One trainable element on four devices: three hold no state (the element is the last device's),
  // and the run is still the plain one.
  auto p = std::make_shared<Parameter>("w", Shape{1});
  const std::vector<Device> devices{cpu(0), cpu(1), cpu(2), cpu(3)};
  p->initialize(devices);
  p->set_data(Tensor::from_vector(std::vector<float>{1.0f}, {1}, cpu(0)));
  ParameterDict dict;
  dict.add("w", p);
  Trainer trainer(dict, "adam", {.learning_rate = 0.1f, .zero_stage = 1});
  for (auto& d : devices) Tensor::from_vector(std::vector<float>{0.5f}, {1}, d).copyto(p->grad(d));
  trainer.step(1);
  CHECK(p->data(cpu(3)).to_vector()[0] == doctest::Approx(0.9f));  // Adam's first step moves by lr
  CHECK(replicas_equal(dict));
  auto memory = trainer.memory_per_device();
  CHECK(memory[3].state_bytes == 8);
  CHECK(memory[0].state_bytes == 0);
}

TEST_CASE("ZeRO-1 and ZeRO-2 state_dict is the unsharded state: equal to the replicated run's, resumed on another device count") {
  const std::vector<Device> four{cpu(0), cpu(1), cpu(2), cpu(3)}, two{cpu(0), cpu(1)};
  for (int stage : {1, 2})
  for (Run r : {Run{}, adam()}) {
    CAPTURE(stage);
    CAPTURE(r.optimizer);
    // The same 3 steps on 4 devices, sharded and replicated: the same state, names and shapes.
    auto make = [&](const std::vector<Device>& devices) {
      manual_seed(42);
      auto net = small_mlp();
      net->initialize(Init::Xavier(), devices);
      return net;
    };
    auto a = make(four), b = make(four);
    Trainer ta(a->collect_params(), r.optimizer, with_stage(r.opt, stage)), tb(b->collect_params(), r.optimizer, r.opt);
    for (int s = 0; s < 3; ++s) train_step(*a, ta, s, four), train_step(*b, tb, s, four);
    const auto sharded = ta.state_dict(), plain = tb.state_dict();
    REQUIRE(sharded.size() == plain.size());
    for (auto& [key, t] : plain) {
      CAPTURE(key);
      REQUIRE(sharded.count(key) == 1);
      CHECK(sharded.at(key).shape == t.shape);
      CHECK(test::close(t.values, sharded.at(key).values, 1e-7, 1e-5, key.c_str()));
    }
    CHECK(ta.state("0.weight", ta.state_names()[0]).empty());  // shards only

    // The 4-device checkpoint continues on 2 devices, sharded and replicated alike.
    auto c = make(two), d = make(two);
    for (auto& [name, p] : a->collect_params()) {
      c->collect_params()[name].set_data(p->list_data()[0]);
      d->collect_params()[name].set_data(p->list_data()[0]);
    }
    Trainer tc(c->collect_params(), r.optimizer, with_stage(r.opt, stage)), td(d->collect_params(), r.optimizer, r.opt);
    tc.load_state_dict(sharded);
    td.load_state_dict(sharded);
    for (int s = 3; s < 8; ++s) train_step(*c, tc, s, two), train_step(*d, td, s, two);
    CHECK(close_values(values_of(d->collect_params()), values_of(c->collect_params())));
    CHECK(replicas_equal(c->collect_params()));
    CHECK(tc.num_update() == 8);

    // Restored on the same 4 devices, it continues bit for bit like the original.
    auto e = make(four);
    for (auto& [name, p] : a->collect_params()) e->collect_params()[name].set_data(p->list_data()[0]);
    Trainer te(e->collect_params(), r.optimizer, with_stage(r.opt, stage));
    te.load_state_dict(sharded);
    for (int s = 3; s < 6; ++s) train_step(*a, ta, s, four), train_step(*e, te, s, four);
    CHECK(values_of(a->collect_params()) == values_of(e->collect_params()));
  }
}

TEST_CASE("ZeRO-1 and ZeRO-2 state follows parameters moved by reset_ctx to other devices and another count") {
  const std::vector<std::vector<Device>> moves{{cpu(0), cpu(1)}, {cpu(1), cpu(2), cpu(3)}, {cpu(0)}, {cpu(2), cpu(0)}};
  std::vector<Values> runs;
  for (int stage : {0, 1, 2}) {
    manual_seed(42);
    auto net = small_mlp();
    net->initialize(Init::Xavier(), moves[0]);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = stage});
    for (size_t m = 0; m < moves.size(); ++m) {
      net->collect_params().reset_ctx(moves[m]);
      for (int s = 0; s < 3; ++s) train_step(*net, trainer, static_cast<int>(3 * m) + s, moves[m]);
      CHECK(replicas_equal(net->collect_params()));
    }
    runs.push_back(values_of(net->collect_params()));
  }
  CHECK(close_values(runs[0], runs[1]));
  CHECK(close_values(runs[0], runs[2]));
}

TEST_CASE("ZeRO: unknown stages, an unsupported kvstore, parameters on different devices are one-line errors") {
  auto p = std::make_shared<Parameter>("w", Shape{2}), q = std::make_shared<Parameter>("v", Shape{3});
  p->initialize({cpu(0), cpu(1)});
  q->initialize({cpu(0), cpu(1)});
  ParameterDict dict;
  dict.add("w", p);
  dict.add("v", q);
  auto one_line = [](auto&& make, const std::string& expected) { test::check_one_line_error<ConfigError>(make, expected); };
  for (int stage : {4, -1})
    one_line([&] { Trainer(dict, "sgd", {.learning_rate = 0.1f, .zero_stage = stage}); },
             "Trainer: zero_stage must be 0 (optimizer state replicated), 1 (ZeRO-1: optimizer state sharded over the "
             "devices), 2 (ZeRO-2: optimizer state and summed gradients sharded) or 3 (ZeRO-3: parameters sharded "
             "too), got " + std::to_string(stage));
  for (int stage : {1, 2})
    for (const std::string kv : {"local"})  // dist_sync and dist_sync_ring shard over the ranks: test_zero_dist.cpp
      one_line([&] { Trainer(dict, "adam", {.zero_stage = stage}, kv); },
               "Trainer: zero_stage " + std::to_string(stage) + " shards the optimizer state over the devices of one "
               "process and needs kvstore 'device' or 'ring', not '" + kv + "'");
  one_line([&] { Trainer(dict, "sgd", {.zero_stage = 2}, "nccl"); }, "kvstore 'nccl' needs GPUs");
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    // DDP's buckets belong to dist_sync, which stages 1 and 2 do not take.
    Trainer t(dict, "sgd", {.learning_rate = 0.1f, .momentum = 0.9f, .zero_stage = stage});
    one_line([&] { t.set_buckets({}); }, "gradient buckets (--bucket-mb) need kvstore dist_sync");
    // One flat vector over one list of devices: a parameter elsewhere is refused before any update.
    q->reset_ctx({cpu(1), cpu(0)});
    const auto before = p->data(cpu(0)).to_vector();
    one_line([&] { t.step(1); },
             "Trainer: zero_stage " + std::to_string(stage) + " needs every trainable parameter on the same devices, "
             "in the same order: 'w' is on [cpu(0), cpu(1)], 'v' on [cpu(1), cpu(0)]");
    CHECK(p->data(cpu(0)).to_vector() == before);
    q->reset_ctx({cpu(0), cpu(1)});
  }
  // Stages 0 to 3 are accepted, and set_learning_rate keeps the stage.
  for (int stage : {0, 1, 2, 3}) {
    Trainer ok(dict, "adam", {.zero_stage = stage}, "ring");
    ok.set_learning_rate(0.5f);
    CHECK(ok.options().zero_stage == stage);
  }
}
