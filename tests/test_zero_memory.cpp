// What a device holds at each ZeRO stage, measured from the allocator (core/allocator.hpp's tags),
// against the ZeRO paper's model (Rajbhandari et al., SC20, section 5), and the ladder it predicts:
// an MLP of equal-width layers trained with Adam, replicated (stage 0) and at stages 1, 2 and 3
// (FullyShardedDataParallel) on 1, 2 and 4 CPU devices.
//   between steps, per device i (Psi_i its shard's elements; at stage 3 Psi'_i, its shard of each
//   unit, FSDP's per-layer split, added up): parameters 4 Psi (4 Psi'_i at stage 3), .grad buffers
//   4 Psi at stages 0 and 1 (none at 2 and 3), a summed gradient of its own 4 Psi_i at stages 2 and
//   3, Adam's state 8 Psi (8 Psi_i sharded), no gathered unit left;
//   the peak per device: at N = 1 no stage above 1.05x the replicated run's; at N = 4 each stage
//   below the one before, and stage 3 at most half the replicated run's.
// tests/mutants runs this file against a zero.cpp that keeps an extra copy of the state: it must fail.
#include <doctest/doctest.h>

#include <map>

#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "check.hpp"
#include "tests/first_devices.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

// 64 -> 64 (relu) x 6 -> 8: every unit about the same size, so the optimizer's bytes dominate.
constexpr int64_t kIn = 64, kWidth = 64, kOut = 8, kBatch = 16;
constexpr int kLayers = 6;

std::shared_ptr<Sequential> equal_layers() {
  auto net = std::make_shared<Sequential>();
  for (int l = 0; l < kLayers; ++l) net->add(std::make_shared<Dense>(kWidth, "relu", true, l == 0 ? kIn : kWidth));
  net->add(std::make_shared<Dense>(kOut, "", true, kWidth));
  return net;
}

std::vector<Device> cpus(int n) { return test::first_devices(n, DeviceKind::cpu, false); }

int64_t tag(const MemoryStats& s, MemoryTag t) { return s.by_tag[static_cast<int>(t)]; }

struct Measured {
  std::vector<std::map<MemoryTag, int64_t>> held;  // per device, by tag, after the last step
  std::vector<int64_t> peak;                       // per device, over the steps after the first
  int64_t psi = 0;
  std::vector<int64_t> units;                      // each layer's Psi_u
};

// Elements [P i / n, P (i+1) / n): shard i of P over n.
int64_t shard_of(int64_t P, int i, int n) { return P * (i + 1) / n - P * i / n; }

Measured run(int n, int stage) {
  const std::vector<Device> devices = cpus(n);
  std::vector<MemoryStats> before;
  for (auto& d : devices) before.push_back(runtime(d).allocator->stats());
  Measured m;
  {
    manual_seed(7);
    auto net = equal_layers();
    net->initialize(Init::Xavier(), devices, true);
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 1e-3f, .zero_stage = stage});
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer);
    for (int s = 0; s < 3; ++s) {
      if (s == 1) {
        waitall();
        for (auto& d : devices) runtime(d).allocator->reset_peak();
      }
      auto X = test::lcg_data(kBatch * kIn, 100 + s);
      std::vector<int32_t> y;
      for (int64_t i = 0; i < kBatch; ++i) y.push_back(X[i * kIn] > 0 ? 1 : 0);
      auto Xs = split_and_load(X, {kBatch, kIn}, devices, false);
      auto ys = split_and_load(y, {kBatch}, devices, false);
      std::vector<Tensor> out = fsdp ? (*fsdp)(Xs) : (*net)(Xs), losses;
      for (size_t i = 0; i < out.size(); ++i) losses.push_back(softmax_cross_entropy(out[i], ys[i], Reduction::sum));
      for (auto& l : losses) l.backward();
      trainer.step(kBatch);
    }
    waitall();
    for (auto& p : net->collect_params().trainable()) m.psi += numel(p->shape());
    for (auto& [name, layer] : net->children()) {
      m.units.push_back(0);
      for (auto& p : layer->collect_params().trainable()) m.units.back() += numel(p->shape());
    }
    for (size_t i = 0; i < devices.size(); ++i) {
      const MemoryStats now = runtime(devices[i]).allocator->stats();
      std::map<MemoryTag, int64_t> held;
      for (MemoryTag t : {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::summed_gradients,
                          MemoryTag::optimizer_state, MemoryTag::gathered})
        held[t] = tag(now, t) - tag(before[i], t);
      m.held.push_back(held);
      m.peak.push_back(now.peak);
    }
  }
  return m;
}

int64_t largest(const std::vector<int64_t>& v) { return *std::max_element(v.begin(), v.end()); }

}  // namespace

TEST_CASE("the bytes each device holds, measured by tag, equal the ZeRO paper's model at stages 0 to 3 on 1, 2 and 4 devices") {
  for (int n : {1, 2, 4})
    for (int stage = 0; stage <= 3; ++stage) {
      CAPTURE(n);
      CAPTURE(stage);
      const Measured m = run(n, stage);
      for (int i = 0; i < n; ++i) {
        CAPTURE(i);
        int64_t shard = shard_of(m.psi, i, n), psi = m.psi;
        if (stage == 3) {  // each unit split by itself
          shard = 0;
          for (int64_t psi_u : m.units) shard += shard_of(psi_u, i, n);
        }
        const auto& h = m.held[static_cast<size_t>(i)];
        CHECK(h.at(MemoryTag::parameters) == 4 * (stage == 3 ? shard : psi));
        CHECK(h.at(MemoryTag::gradients) == (stage >= 2 ? 0 : 4 * psi));
        CHECK(h.at(MemoryTag::summed_gradients) == (stage >= 2 ? 4 * shard : 0));
        CHECK(h.at(MemoryTag::optimizer_state) == 8 * (stage == 0 ? psi : shard));
        CHECK(h.at(MemoryTag::gathered) == 0);
      }
    }
}

TEST_CASE("the ladder: at N = 1 sharding costs nothing; at N = 4 each stage's peak below the one before") {
  std::map<int, int64_t> one, four;
  for (int stage = 0; stage <= 3; ++stage) {
    one[stage] = largest(run(1, stage).peak);
    four[stage] = largest(run(4, stage).peak);
  }
  for (int stage = 1; stage <= 3; ++stage) {
    CAPTURE(stage);
    CHECK(double(one[stage]) <= 1.05 * double(one[0]));
    CHECK(four[stage] < four[stage - 1]);
  }
  CHECK(2 * four[3] <= four[0]);
  MESSAGE("peak per device at N = 4: " << four[0] << " > " << four[1] << " > " << four[2] << " > " << four[3] << " bytes");
}
