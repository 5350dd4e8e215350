// ZeRO stage 3 over the ranks (core/optim/zero.hpp: zero_stage 3 with kvstore dist_sync or
// dist_sync_ring, run through optim::FullyShardedDataParallel), run as 1, 2 and 4 processes
// (tests/dist/mpirun.sh). An MLP of three units (and a Flatten without parameters), one device per
// rank, rank r taking its rows of every global batch. The references:
//   alone       every rank trains the same MLP by itself on the whole global batch on one device
//               (kvstore 'device', no collectives): the unsharded run, equal within 1e-5 relative
//               (one GEMM over the batch adds in another order than the sum over the ranks);
//   replicated  stage 0 with the same kvstore over the same ranks: the allreduce and ZeRO-3's
//               reduce-scatter add the same two numbers at 2 ranks (bit for bit), and may add four in
//               another order at 4 ranks (within 1e-5 relative; the message says which).
// Also: every rank's gathered parameters the same bits; between steps no replica holds memory; the
// bytes of each rank against 4 * chunk (parameters), 0 (.grad buffers), 4 * chunk (summed gradient),
// 4 * slots * chunk (state), the chunk recomputed here from the units' sizes and chunk_begin's rule;
// gradient accumulation (two backward passes a step); state_dict in the unsharded layout, and loaded
// with the parameters of step 10 into a new net and Trainer continuing as 20 steps straight; the peak
// the allocator measured below the replicated run's (tests/dist/fsdp_peak.sh compares it between
// 2 and 4 ranks); clip_grad_norm over every unit's chunk against the unsharded run's norm computed
// here; the configuration errors. tests/mutants runs this file as 2 processes against a
// zero_fsdp.cpp whose reduce-scatter overwrites the summed gradient instead of adding into it, and
// one whose gather never receives the other ranks' chunks: both must fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>

#include "check.hpp"
#include "one_line_error.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/nn.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/zero.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "tests/dist/dist_check.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;

namespace {

// (2, 3) images -> flatten -> 6 -> 7 (relu) -> 5 (relu) -> 3: units of 49, 40 and 18 elements, P = 107,
// which 2 and 4 do not divide: uneven chunks, parameters straddling them.
constexpr int64_t kIn = 6;
const std::vector<int64_t> kUnits{6 * 7 + 7, 7 * 5 + 5, 5 * 3 + 3};
constexpr int64_t kGlobal = 8;  // rows [8 r / W, 8 (r + 1) / W) on rank r

std::shared_ptr<Sequential> three_units(const std::vector<Device>& on = {cpu(0)}) {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Flatten>(), std::make_shared<Dense>(7, "relu", true, kIn),
           std::make_shared<Dense>(5, "relu", true, 7), std::make_shared<Dense>(3, "", true, 5));
  manual_seed(11);  // the same initial values in every run, on every rank
  net->initialize(Init::Xavier(), on);
  return net;
}

struct Setup {
  std::string optimizer = "sgd";
  OptimizerOptions opt{.learning_rate = 0.1f, .momentum = 0.9f, .wd = 1e-3f};
  std::string kvstore = "dist_sync";
  bool prefetch = true;
  int passes = 1;  // backward passes a step
};
Setup adam_setup() { return Setup{"adam", {.learning_rate = 0.01f, .wd = 1e-3f}}; }

using Params = std::vector<std::vector<float>>;  // per trainable parameter, flattened

// Step s, pass p: the global batch from an LCG, labels from the features' signs; rows [lo, hi) of
// it through `run`, one loss summed over the rows, backward.
template <class Run>
void backward_rows(Run&& run, int s, int p, int64_t lo, int64_t hi) {
  const auto X = test::lcg_data(kGlobal * kIn, 900 + 31 * static_cast<uint32_t>(s) + static_cast<uint32_t>(p));
  std::vector<float> rows(X.begin() + lo * kIn, X.begin() + hi * kIn);
  std::vector<int32_t> y;
  for (int64_t i = lo; i < hi; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  Tensor Xt = Tensor::from_vector(rows, {hi - lo, 2, 3}, cpu(0));
  Tensor yt = Tensor::from_vector(y, {hi - lo}, cpu(0));
  softmax_cross_entropy(run(Xt), yt, Reduction::sum).backward();
}

struct Result {
  Params params;
  std::vector<DeviceMemory> memory;
  std::map<std::string, HostTensor> state;
  bool released = true;  // no replica held memory after any step (stage 3)
  // With clip_grad_norm: last_grad_norm() after every step; alone, also the norm of .grad (the whole
  // global batch's gradient, the sum) / the batch computed here in double before each step.
  std::vector<double> norms, reference;
};

Params params_of(Sequential& net) {
  Params out;
  for (auto& p : net.collect_params().trainable()) out.push_back(p->list_data()[0].to_vector());
  return out;
}

// stage 0 or 3 over the ranks (this rank's rows), or `alone` (the whole batch, kvstore 'device');
// over `group`'s ranks only when given (the Trainer's dp_group: this rank's rows of the group's split).
Result train(const Setup& u, int stage, bool alone = false, int steps = 20, const dist::Group* group = nullptr) {
  auto net = three_units();
  OptimizerOptions o = u.opt;
  o.zero_stage = stage;
  if (group) o.dp_group = *group;
  Trainer trainer(net->collect_params(), u.optimizer, o, alone ? "device" : u.kvstore);
  std::unique_ptr<FullyShardedDataParallel> fsdp;
  if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer, FsdpOptions{u.prefetch});
  auto run = [&](const Tensor& X) { return fsdp ? (*fsdp)({X})[0] : (*net)(X); };
  const int W = alone ? 1 : group ? group->size() : dist::world_size(), r = alone ? 0 : group ? group->rank() : dist::rank();
  Result out;
  for (int s = 0; s < steps; ++s) {
    for (int p = 0; p < u.passes; ++p) backward_rows(run, s, p, kGlobal * r / W, kGlobal * (r + 1) / W);
    if (alone && u.opt.clip_grad_norm > 0) {
      double squares = 0;
      for (auto& p : net->collect_params().trainable())
        for (float g : p->list_data()[0].grad().to_vector()) squares += double(g) * g;
      out.reference.push_back(std::sqrt(squares) / double(kGlobal * u.passes));
    }
    trainer.step(kGlobal * u.passes);
    out.norms.push_back(trainer.last_grad_norm());
    if (stage == 3)
      for (auto& p : net->collect_params().trainable()) out.released = out.released && !p->list_data()[0].storage();
  }
  if (stage == 3) {
    out.params = trainer.rank_shards()->parameters();  // a collective
  } else {
    out.params = params_of(*net);
  }
  out.memory = trainer.memory_per_device();
  out.state = trainer.state_dict();  // a collective at stage 3
  return out;
}

bool close_params(const Params& ref, const Params& got, double atol = 1e-7) {
  bool ok = ref.size() == got.size();
  for (size_t k = 0; ok && k < ref.size(); ++k) ok = test::close(ref[k], got[k], atol, 1e-5, "parameter") && ok;
  return ok;
}

Params state_values(const std::map<std::string, HostTensor>& state) {
  Params out;
  for (auto& [key, t] : state) out.push_back(t.values);
  return out;
}

// Rank r's chunk over the units: per unit chunk_begin's rule, P_u (r + 1) / W - P_u r / W, recomputed here.
int64_t chunk_of(const std::vector<int64_t>& units, int r, int W) {
  int64_t n = 0;
  for (int64_t P : units) n += P * (r + 1) / W - P * r / W;
  return n;
}

void compare(const Setup& u) {
  CAPTURE(u.optimizer);
  CAPTURE(u.kvstore);
  CAPTURE(u.prefetch);
  CAPTURE(u.passes);
  const int W = dist::world_size();
  const Result alone = train(u, 0, true), replicated = train(u, 0), sharded = train(u, 3);
  // The runs learned something: the comparison is not between untouched nets.
  const Params start = params_of(*three_units());
  double moved = 0;
  for (size_t k = 0; k < start.size(); ++k)
    for (size_t j = 0; j < start[k].size(); ++j) moved = std::max(moved, double(std::fabs(alone.params[k][j] - start[k][j])));
  CHECK(moved > 0.05);
  CHECK(sharded.released);
  CHECK(close_params(alone.params, sharded.params));
  CHECK(close_params(replicated.params, sharded.params));
  CHECK(close_params(state_values(replicated.state), state_values(sharded.state)));
  // Two ranks: both sums add the same two numbers. One pass a step: the same bits.
  if (W <= 2 && u.passes == 1) {
    CHECK(sharded.params == replicated.params);
    CHECK(state_values(sharded.state) == state_values(replicated.state));
  }
  CHECK(test::same_bits_on_every_rank(sharded.params));
  CHECK(test::same_bits_on_every_rank(state_values(sharded.state)));
  REQUIRE(sharded.state.size() == replicated.state.size());
  for (auto& [key, t] : replicated.state) {
    CAPTURE(key);
    REQUIRE(sharded.state.count(key));
    CHECK(sharded.state.at(key).shape == t.shape);
  }
  if (dist::rank() == 0)
    MESSAGE(u.optimizer << ", " << u.kvstore << std::string(u.prefetch ? ", prefetch, " : ", no prefetch, ") << u.passes
                        << " pass(es), " << W << " ranks: ZeRO-3 and replicated have "
                        << std::string(sharded.params == replicated.params ? "the same bits" : "different last bits"));
}

}  // namespace

TEST_CASE("ZeRO-3 over the ranks equals the replicated run and the unsharded one over 20 steps, SGD with momentum and Adam") {
  for (const Setup& base : {Setup{}, adam_setup()})
    for (const std::string kv : {"dist_sync", "dist_sync_ring"})
      for (bool prefetch : {true, false}) {
        Setup u = base;
        u.kvstore = kv;
        u.prefetch = prefetch;
        compare(u);
      }
}

TEST_CASE("ZeRO-3 over the ranks with gradient accumulation: two backward passes a step add into the chunks") {
  for (Setup u : {Setup{}, adam_setup()}) {
    u.passes = 2;
    compare(u);
  }
}

TEST_CASE("clip_grad_norm: ZeRO-3 over the ranks clips by the norm of the whole summed gradient, every unit's chunk on every rank") {
  for (const Setup& base : {Setup{}, adam_setup()}) {
    CAPTURE(base.optimizer);
    Setup loose = base;  // a max_norm above every norm: the unclipped run, bit for bit
    loose.opt.clip_grad_norm = 1e30f;
    CHECK(train(loose, 3).params == train(base, 3).params);
    Setup u = base;
    u.opt.clip_grad_norm = static_cast<float>(0.1 * train(loose, 0, true, 1).norms[0]);  // a tenth of step 1's: it clips
    const Result alone = train(u, 0, true), replicated = train(u, 0), sharded = train(u, 3);
    CHECK(alone.norms[0] > 5 * u.opt.clip_grad_norm);
    CHECK(test::close(alone.reference, alone.norms, 0, 1e-5, "unsharded norm"));
    CHECK(test::close(alone.reference, replicated.norms, 0, 1e-5, "replicated norm"));
    CHECK(test::close(alone.reference, sharded.norms, 0, 1e-5, "ZeRO-3 norm"));
    CHECK(test::same_bits_on_every_rank({std::vector<float>(sharded.norms.begin(), sharded.norms.end())}));
    CHECK(close_params(alone.params, sharded.params));
    CHECK(close_params(replicated.params, sharded.params));
    CHECK(alone.params != train(base, 0, true).params);  // clipping changed the run
    if (dist::world_size() <= 2) CHECK(sharded.params == replicated.params);
    CHECK(test::same_bits_on_every_rank(sharded.params));
  }
}

// A dp group (the grid's column, or any ranks sharing a model): the world split by rank parity, so
// 4 ranks make two groups of 2, 3 ranks one of 2 and one of 1. Each group trains the whole global
// batch by itself, its ranks taking their rows of it: every group equals the unsharded run, and the
// replicated run over the same group (bit for bit where a group has at most 2 ranks); each rank keeps
// its chunk of the group's split, the chunks of a group adding up to one copy.
TEST_CASE("ZeRO-3 over a group of ranks (the Trainer's dp_group) equals the unsharded run, each rank keeping its chunk of the group's split") {
  const dist::Group group = dist::split(dist::rank() % 2);
  CAPTURE(group.str());
  const int64_t P = kUnits[0] + kUnits[1] + kUnits[2], mine = chunk_of(kUnits, group.rank(), group.size());
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const int64_t slots = u.optimizer == "adam" ? 2 : 1;
    const Result alone = train(u, 0, true), replicated = train(u, 0, false, 20, &group), sharded = train(u, 3, false, 20, &group);
    CHECK(sharded.released);
    CHECK(close_params(alone.params, sharded.params));
    CHECK(close_params(replicated.params, sharded.params));
    if (group.size() <= 2) CHECK(sharded.params == replicated.params);
    REQUIRE(sharded.memory.size() == 1);
    CHECK(sharded.memory[0].parameter_bytes == 4 * mine);
    CHECK(sharded.memory[0].state_bytes == 4 * slots * mine);
    const auto total = dist::sum_over_ranks({double(sharded.memory[0].state_bytes)}, group);
    CHECK(total[0] == double(4 * slots * P));
  }
}

// Two devices a rank: device i of rank r takes part 2 r + i of every global batch (its rows of 2 W
// parts), the net run through FSDP on both (stage 3) or replicated over every device (stage 0).
Result train_two_devices(const Setup& u, int stage, ShardOver over = ShardOver::ranks, int steps = 20) {
  const std::vector<Device> two{cpu(0), cpu(1)};
  use_devices(two);
  Result out;
  {
    auto net = three_units(two);
    OptimizerOptions o = u.opt;
    o.zero_stage = stage;
    o.shard_over = over;
    Trainer trainer(net->collect_params(), u.optimizer, o, u.kvstore);
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer, FsdpOptions{u.prefetch});
    const int64_t parts = 2 * dist::world_size();
    for (int s = 0; s < steps; ++s) {
      const auto X = test::lcg_data(kGlobal * kIn, 900 + 31 * static_cast<uint32_t>(s));
      std::vector<Tensor> xs, ys;
      for (int i = 0; i < 2; ++i) {
        const int64_t q = 2 * dist::rank() + i, lo = kGlobal * q / parts, hi = kGlobal * (q + 1) / parts;
        std::vector<int32_t> y;
        for (int64_t j = lo; j < hi; ++j) y.push_back((X[j * kIn] > 0) + (X[j * kIn + 1] > 0));
        xs.push_back(Tensor::from_vector(std::vector<float>(X.begin() + lo * kIn, X.begin() + hi * kIn), {hi - lo, 2, 3}, two[i]));
        ys.push_back(Tensor::from_vector(y, {hi - lo}, two[i]));
      }
      const std::vector<Tensor> outs = fsdp ? (*fsdp)(xs) : (*net)(xs);
      std::vector<Tensor> ls;
      for (int i = 0; i < 2; ++i) ls.push_back(softmax_cross_entropy(outs[static_cast<size_t>(i)], ys[static_cast<size_t>(i)], Reduction::sum));
      for (auto& l : ls) l.backward();
      trainer.step(kGlobal);
      if (stage == 3)
        for (auto& p : net->collect_params().trainable())
          for (auto& w : p->list_data()) out.released = out.released && !w.storage();
    }
    out.params = stage == 3 ? trainer.shards()->parameters() : params_of(*net);
    out.memory = trainer.memory_per_device();
  }
  use_devices({cpu(0)});
  return out;
}

// ZeRO-3 over the ranks with two devices a rank: the rank's chunk on its first device, the second
// holding each unit only while it runs; every device's gradients reduce-scattered into the chunk.
// With ShardOver::all_devices each device keeps its own piece instead: shard 2 r + i of 2 W of every unit.
TEST_CASE("ZeRO-3 over the ranks with 2 devices a rank equals the unsharded run, the chunks on the first device or split over both") {
  const int64_t mine = chunk_of(kUnits, dist::rank(), dist::world_size());
  const int64_t piece[2] = {chunk_of(kUnits, 2 * dist::rank(), 2 * dist::world_size()),
                            chunk_of(kUnits, 2 * dist::rank() + 1, 2 * dist::world_size())};
  for (const Setup& base : {Setup{}, adam_setup()})
    for (bool prefetch : {true, false}) {
      Setup u = base;
      u.prefetch = prefetch;
      CAPTURE(u.optimizer);
      CAPTURE(prefetch);
      const int64_t slots = u.optimizer == "adam" ? 2 : 1;
      const Result alone = train(u, 0, true), replicated = train_two_devices(u, 0), sharded = train_two_devices(u, 3);
      CHECK(sharded.released);
      // Up to 8 parts of one row each, summed over devices and ranks in another order than one GEMM
      // over the batch: equal within 1e-6 absolute (elements near zero) or 1e-5 relative.
      CHECK(close_params(alone.params, replicated.params, 1e-6));
      CHECK(close_params(alone.params, sharded.params, 1e-6));
      CHECK(close_params(replicated.params, sharded.params, 1e-6));
      CHECK(test::same_bits_on_every_rank(sharded.params));
      REQUIRE(sharded.memory.size() == 2);
      CHECK(sharded.memory[0].parameter_bytes == 4 * mine);
      CHECK(sharded.memory[0].summed_gradient_bytes == 4 * mine);
      CHECK(sharded.memory[0].state_bytes == 4 * slots * mine);
      CHECK(sharded.memory[1].parameter_bytes == 0);
      CHECK(sharded.memory[1].state_bytes == 0);
      CHECK(sharded.memory[1].gradient_bytes == 0);
      const Result split = train_two_devices(u, 3, ShardOver::all_devices);
      CHECK(split.released);
      CHECK(close_params(alone.params, split.params, 1e-6));
      CHECK(close_params(sharded.params, split.params, 1e-6));
      CHECK(test::same_bits_on_every_rank(split.params));
      REQUIRE(split.memory.size() == 2);
      for (int i = 0; i < 2; ++i) {
        CAPTURE(i);
        CHECK(split.memory[static_cast<size_t>(i)].parameter_bytes == 4 * piece[i]);
        CHECK(split.memory[static_cast<size_t>(i)].summed_gradient_bytes == 4 * piece[i]);
        CHECK(split.memory[static_cast<size_t>(i)].state_bytes == 4 * slots * piece[i]);
        CHECK(split.memory[static_cast<size_t>(i)].gradient_bytes == 0);
      }
    }
}

// HYBRID_SHARD at stage 3 (ShardOver::devices): every rank shards the whole model over its own 2
// devices, as one process does (device i keeps shard i of the P elements: parameters, summed
// gradient, state), and the ranks are replicas of each other: each device's summed pieces are
// all-reduced over the ranks before the update, and a unit is gathered over the process's devices only.
TEST_CASE("ZeRO-3 sharded over each process's devices, replicated over the ranks (HYBRID_SHARD), equals the unsharded run") {
  const int64_t P = kUnits[0] + kUnits[1] + kUnits[2];
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const int64_t slots = u.optimizer == "adam" ? 2 : 1;
    const Result alone = train(u, 0, true), hybrid = train_two_devices(u, 3, ShardOver::devices);
    CHECK(hybrid.released);
    CHECK(close_params(alone.params, hybrid.params, 1e-6));
    CHECK(test::same_bits_on_every_rank(hybrid.params));
    REQUIRE(hybrid.memory.size() == 2);
    for (int i = 0; i < 2; ++i) {
      CAPTURE(i);
      const int64_t shard = chunk_of({P}, i, 2);  // the same shard on every rank
      CHECK(hybrid.memory[static_cast<size_t>(i)].parameter_bytes == 4 * shard);
      CHECK(hybrid.memory[static_cast<size_t>(i)].summed_gradient_bytes == 4 * shard);
      CHECK(hybrid.memory[static_cast<size_t>(i)].state_bytes == 4 * slots * shard);
      CHECK(hybrid.memory[static_cast<size_t>(i)].gradient_bytes == 0);
    }
  }
}

TEST_CASE("ZeRO-3 over the ranks, bytes of a rank between steps: parameters 4 chunk, no .grad, summed gradient 4 chunk, state 4 slots chunk") {
  const int W = dist::world_size(), r = dist::rank();
  const int64_t P = kUnits[0] + kUnits[1] + kUnits[2], mine = chunk_of(kUnits, r, W);
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const int64_t slots = u.optimizer == "adam" ? 2 : 1;
    const Result sharded = train(u, 3, false, 2);
    REQUIRE(sharded.memory.size() == 1);  // one device per rank
    const DeviceMemory& m = sharded.memory[0];
    CHECK(m.device == cpu(0));
    CHECK(m.parameter_bytes == 4 * mine);
    CHECK(m.gradient_bytes == 0);
    CHECK(m.summed_gradient_bytes == 4 * mine);
    CHECK(m.state_bytes == 4 * slots * mine);
    // Every element kept exactly once over the ranks.
    const auto total = dist::sum_over_ranks({double(m.parameter_bytes), double(m.summed_gradient_bytes), double(m.state_bytes)});
    CHECK(total[0] == double(4 * P));
    CHECK(total[1] == double(4 * P));
    CHECK(total[2] == double(4 * slots * P));
  }
}

TEST_CASE("ZeRO-3 over the ranks: the gathered parameters are the same bits on every rank, and the chunks' values") {
  auto net = three_units();
  Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = 3}, "dist_sync");
  FullyShardedDataParallel fsdp(net, trainer);
  const int W = dist::world_size(), r = dist::rank();
  auto run = [&](const Tensor& X) { return fsdp({X})[0]; };
  for (int s = 0; s < 3; ++s) {
    backward_rows(run, s, 0, kGlobal * r / W, kGlobal * (r + 1) / W);
    trainer.step(kGlobal);
  }
  const Params chunks = trainer.rank_shards()->parameters();
  Params whole;
  {
    FullyShardedDataParallel::FullParameters full(fsdp);
    whole = params_of(*net);
  }
  CHECK(whole == chunks);
  CHECK(test::same_bits_on_every_rank(whole));
  // A second FullyShardedDataParallel of the same net and Trainer keeps the chunks and the state.
  const auto state = state_values(trainer.state_dict());
  {
    FullyShardedDataParallel again(net, trainer);
    CHECK(trainer.rank_shards()->parameters() == chunks);
    CHECK(state_values(trainer.state_dict()) == state);
  }
  // Outside the scope the replicas have no memory again.
  for (auto& p : net->collect_params().trainable()) CHECK(!p->list_data()[0].storage());
}

TEST_CASE("ZeRO-3 over the ranks: the peak the allocator measures is below the replicated run's") {
  // Eight units of 128 x 128 and a small batch: the parameters, not the activations, fill the memory.
  auto peak_of = [](int stage) {
    manual_seed(5);
    auto net = std::make_shared<Sequential>();
    for (int l = 0; l < 8; ++l) net->add(std::make_shared<Dense>(128, l < 7 ? "relu" : "", true, 128));
    net->initialize(Init::Xavier(), {cpu(0)});
    Trainer trainer(net->collect_params(), "adam", {.learning_rate = 0.01f, .zero_stage = stage}, "dist_sync");
    std::unique_ptr<FullyShardedDataParallel> fsdp;
    if (stage == 3) fsdp = std::make_unique<FullyShardedDataParallel>(net, trainer);
    int64_t peak = 0;
    for (int s = 0; s < 3; ++s) {
      waitall();
      runtime(cpu(0)).allocator->reset_peak();
      auto X = Tensor::from_vector(test::lcg_data(2 * 128, static_cast<uint32_t>(s)), {2, 128}, cpu(0));
      auto out = fsdp ? (*fsdp)({X})[0] : (*net)(X);
      sum(out).backward();
      trainer.step(2 * dist::world_size());
      waitall();
      peak = std::max(peak, runtime(cpu(0)).allocator->stats().peak);
    }
    return peak;
  };
  const int64_t replicated = peak_of(0), sharded = peak_of(3);
  const int W = dist::world_size();
  // The largest over the ranks (a collective).
  std::vector<double> mine(static_cast<size_t>(2 * W), 0.0);
  mine[static_cast<size_t>(2 * dist::rank())] = double(replicated);
  mine[static_cast<size_t>(2 * dist::rank() + 1)] = double(sharded);
  const std::vector<double> all = dist::sum_over_ranks(mine);
  double most_replicated = 0, most_sharded = 0;
  for (int r = 0; r < W; ++r)
    most_replicated = std::max(most_replicated, all[static_cast<size_t>(2 * r)]),
    most_sharded = std::max(most_sharded, all[static_cast<size_t>(2 * r + 1)]);
  if (dist::rank() == 0) {
    // tests/dist/fsdp_peak.sh reads this line of 2 and 4 ranks.
    std::printf("peak bytes a rank, Adam, %d ranks: replicated %.0f, ZeRO-3 %.0f\n", W, most_replicated, most_sharded);
    std::fflush(stdout);
  }
  // Between steps a rank keeps 16 bytes an element of its chunks (Adam); on top of that, while it
  // runs, about two units are whole at once (the rate limiter) with their gradients and buffers: a
  // few units' worth, whatever W (9 units' 4 P_u measured), never the whole net (8 units of 16 P_u).
  const int64_t unit = 128 * 128 + 128, chunk = 8 * (unit * (dist::rank() + 1) / W - unit * dist::rank() / W);
  CHECK(sharded - 16 * chunk <= 12 * 4 * unit);
  if (W >= 2) CHECK(sharded < replicated);
}

TEST_CASE("ZeRO-3 over the ranks: a state_dict after 10 steps, loaded with the parameters into a new net, continues as 20 steps straight") {
  const int W = dist::world_size(), r = dist::rank();
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const Result straight = train(u, 3);
    OptimizerOptions o = u.opt;
    o.zero_stage = 3;
    auto steps = [&](FullyShardedDataParallel& f, Trainer& t, int from, int to) {
      auto run = [&](const Tensor& X) { return f({X})[0]; };
      for (int s = from; s < to; ++s) {
        backward_rows(run, s, 0, kGlobal * r / W, kGlobal * (r + 1) / W);
        t.step(kGlobal);
      }
    };
    Params at_ten;
    std::map<std::string, HostTensor> saved;
    {
      auto net = three_units();
      Trainer first(net->collect_params(), u.optimizer, o, u.kvstore);
      FullyShardedDataParallel f(net, first);
      steps(f, first, 0, 10);
      saved = first.state_dict();  // a collective
      FullyShardedDataParallel::FullParameters whole(f);
      at_ten = params_of(*net);
    }
    // A new net given the parameters of step 10, and a new Trainer the state: loaded before the
    // sharding (sgd) or after it, waiting for the next step (adam).
    auto net = three_units();
    auto params = net->collect_params().trainable();
    for (size_t k = 0; k < params.size(); ++k)
      Tensor::from_vector(at_ten[k], params[k]->shape(), cpu(0)).copyto(params[k]->list_data()[0]);
    Trainer second(net->collect_params(), u.optimizer, o, u.kvstore);
    if (u.optimizer == "sgd") second.load_state_dict(saved);
    FullyShardedDataParallel f(net, second);
    if (u.optimizer != "sgd") second.load_state_dict(saved);
    steps(f, second, 10, 20);
    CHECK(second.rank_shards()->parameters() == straight.params);
    CHECK(state_values(second.state_dict()) == state_values(straight.state));
  }
}

TEST_CASE("ZeRO-3 over the ranks: configuration errors in one line, before any collective") {
  auto one_line = [](auto&& make, const std::string& expected) { test::check_one_line_error(make, expected); };
  for (const std::string kv : {"dist_sync", "dist_sync_ring"}) {
    // Parameters on different devices: the chunks live on one device list, the same for every parameter.
    auto net = std::make_shared<Sequential>();
    auto first = std::make_shared<Dense>(3, "", true, kIn), second = std::make_shared<Dense>(2, "", true, 3);
    net->add(first, second);
    first->initialize(Init::Xavier(), {cpu(0), cpu(1)});
    second->initialize(Init::Xavier(), {cpu(1)});
    Trainer t(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3}, kv);
    one_line([&] { FullyShardedDataParallel f(net, t); }, "zero_stage 3 needs every trainable parameter on the same devices");
  }
  auto net = three_units();
  {
    Trainer t(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 3}, "dist_sync");
    one_line([&] { t.set_buckets({}); }, "zero_stage 3 reduce-scatters them");
    one_line([&] { t.step(kGlobal); }, "run the net through optim::FullyShardedDataParallel(net, trainer)");
  }
}
