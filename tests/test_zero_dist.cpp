// ZeRO stages 1 and 2 over the ranks (core/optim/zero.hpp: zero_stage 1 and 2 with kvstore
// dist_sync or dist_sync_ring), run as 1, 2 and 4 processes (tests/dist/mpirun.sh). A small MLP, one
// device per rank, rank r taking its rows of every global batch. The references:
//   alone       every rank trains the same MLP by itself on the whole global batch on one device
//               (kvstore 'device', no collectives): the unsharded run, equal within 1e-5 relative
//               (one GEMM over the batch adds in another order than the sum over the ranks);
//   replicated  stage 0 with the same kvstore over the same ranks: bit for bit on 2 ranks (a + b =
//               b + a) and with MPI's allreduce (dist_sync); the book's ring (dist_sync_ring) adds 4
//               ranks in another order than MPI's reduce-scatter, so there within 1e-5 relative.
// Stages 1 and 2 both reduce-scatter: the same bits as each other, whatever the bucket size.
// Also: every rank's parameters the same bits after every run; the state bytes of each rank
// 4 * slots * its chunk (8 * chunk for Adam), the chunk recomputed here from chunk_begin's rule; the
// summed gradient kept 4 * chunk at stage 2; no .grad buffer at stage 2 after backward, all of them
// at stage 1; the bytes sent per rank, read from dist::collective_counters, against the paper's
// (W-1)/W * 2 * 4 P; state_dict in the unsharded layout equal to the alone
// run's and the replicated run's; a checkpoint taken after 10 steps and loaded by a new Trainer
// continuing to 20 steps equal to 20 steps straight; clip_grad_norm over the ranks against the
// unsharded run's norm computed here; loss scaling (core/optim/grad_scaler.hpp) with an inf in the
// last rank's input only: every rank skips that step, at ZeRO-2 too, where the inf reaches one
// chunk's holder only, and with kvstore 'device' and a tp_group, where nothing else is summed over
// the ranks; the configuration errors; hybrid sharding (ShardOver: the
// shards over the ranks, over each process's 2 devices, or over every device of every rank) against the unsharded run and
// stage 0 over the same devices, with the state each device holds measured; with 3 devices a rank
// and every device its own shard, the bytes copied between the devices in a step, read from the copy
// counters, against the two-level collectives' (no device gathers the others' gradients). tests/mutants runs
// this file as 2 processes against a zero_dist.cpp that skips the all-gather into the parameters,
// one that updates each chunk twice and one that sums the devices' shares on the first device: all must fail.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "check.hpp"
#include "core/allocator.hpp"
#include "core/copy.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/nn.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/optim/zero.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"
#include "tests/dist/dist_check.hpp"
#include "tests/dist/zero_mlp.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;
using namespace d2l::test;

namespace {

// Bucket sizes: one parameter a bucket; 5e-5 MiB (52 bytes), which cuts the 4 parameters (80, 20,
// 60 and 12 bytes) from the back into [2, 4) and [0, 2); the default 25 MiB, one bucket.
constexpr double kSmallBucketMb = 5e-5;

struct Result {
  Values params;
  std::vector<DeviceMemory> memory;
  std::map<std::string, HostTensor> state;
  // With clip_grad_norm: last_grad_norm() after every step; alone(), also the norm of .grad (the whole
  // global batch's gradient, the sum) / kGlobalBatch computed here in double before each step.
  std::vector<double> norms, reference;
};

// A run over the ranks at this stage, 20 steps.
Result over_ranks(const Setup& u, int stage, int steps = 20, double bucket_mb = OptimizerOptions{}.reduce_bucket_mb) {
  auto net = mlp_43();
  Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, stage, bucket_mb), u.kvstore);
  std::vector<double> norms;
  train_steps(*net, trainer, 0, steps, &norms);
  return {params_of(net->collect_params()), trainer.memory_per_device(), trainer.state_dict(), norms, {}};
}

// The unsharded reference: the whole global batch on one device of this process, no collectives.
Result alone(const Setup& u, int steps = 20) {
  auto net = mlp_43();
  Trainer trainer(net->collect_params(), u.optimizer, u.opt, "device");
  std::vector<double> norms, reference;
  for (int s = 0; s < steps; ++s) {
    backward_rows(*net, s, 0, kGlobalBatch);
    double squares = 0;
    for (auto& p : net->collect_params().trainable())
      for (float g : p->list_data()[0].grad().to_vector()) squares += double(g) * g;
    reference.push_back(std::sqrt(squares) / kGlobalBatch);
    trainer.step(kGlobalBatch);
    norms.push_back(trainer.last_grad_norm());
  }
  return {params_of(net->collect_params()), trainer.memory_per_device(), trainer.state_dict(), norms, reference};
}

bool close_maps(const Values& ref, const Values& got) {
  bool ok = ref.size() == got.size();
  for (auto& [name, v] : ref) ok = got.count(name) && test::close(v, got.at(name), 1e-7, 1e-5, name.c_str()) && ok;
  return ok;
}

// Every rank holds the same bits (a collective: every rank calls it).
bool same_on_every_rank(const Values& v) {
  std::vector<std::vector<float>> all;
  for (auto& [name, values] : v) all.push_back(values);
  return test::same_bits_on_every_rank(all);
}

// Rank r's chunk of P elements: chunk_begin's rule, P (r + 1) / W - P r / W, recomputed here.
int64_t chunk_of(int64_t P, int r, int W) { return P * (r + 1) / W - P * r / W; }

}  // namespace

TEST_CASE("ZeRO-1 and ZeRO-2 over the ranks equal the unsharded run over 20 steps, SGD with momentum and Adam") {
  for (const Setup& base : {Setup{}, adam_setup()})
    for (const std::string kv : {"dist_sync", "dist_sync_ring"}) {
      Setup u = base;
      u.kvstore = kv;
      CAPTURE(u.optimizer);
      CAPTURE(u.kvstore);
      const Result ref = alone(u), replicated = over_ranks(u, 0), stage1 = over_ranks(u, 1), stage2 = over_ranks(u, 2);
      // The runs learned something: the comparison is not between untouched nets.
      const Values start = params_of(mlp_43()->collect_params());
      double moved = 0;
      for (auto& [name, v] : ref.params)
        for (size_t j = 0; j < v.size(); ++j) moved = std::max(moved, double(std::fabs(v[j] - start.at(name)[j])));
      CHECK(moved > 0.05);
      CHECK(close_maps(ref.params, replicated.params));
      CHECK(close_maps(ref.params, stage1.params));
      CHECK(close_maps(ref.params, stage2.params));
      CHECK(stage1.params == stage2.params);  // the same reduce-scatter, each element updated once: bit for bit
      const bool same_sums = dist::world_size() <= 2 || u.kvstore == "dist_sync";
      if (same_sums) CHECK(stage1.params == replicated.params);
      CHECK(close_maps(replicated.params, stage2.params));
      CHECK(same_on_every_rank(stage1.params));
      CHECK(same_on_every_rank(stage2.params));
      if (dist::rank() == 0)
        MESSAGE(u.optimizer << ", " << u.kvstore << ", " << dist::world_size() << " ranks: ZeRO-2 and replicated have "
                            << std::string(stage2.params == replicated.params ? "the same bits" : "different last bits"));
      // The checkpoint: the unsharded layout, gathered from every rank; the same on every rank.
      CHECK(close_maps(state_values(ref.state), state_values(stage1.state)));
      CHECK(close_maps(state_values(ref.state), state_values(stage2.state)));
      if (same_sums) CHECK(state_values(stage1.state) == state_values(replicated.state));
      CHECK(state_values(stage1.state) == state_values(stage2.state));
      CHECK(same_on_every_rank(state_values(stage2.state)));
      for (const auto* s : {&stage1.state, &stage2.state})
        for (auto& [key, t] : ref.state) {
          CAPTURE(key);
          REQUIRE(s->count(key));
          CHECK(s->at(key).shape == t.shape);
        }
    }
}

TEST_CASE("clip_grad_norm over the ranks: ZeRO-1 and ZeRO-2 clip by the whole summed gradient's norm, as the unsharded run") {
  for (const Setup& base : {Setup{}, adam_setup()})
    for (const std::string kv : {"dist_sync", "dist_sync_ring"}) {
      Setup loose = base;  // a max_norm above every norm clips nothing: the unclipped run, bit for bit
      loose.kvstore = kv;
      loose.opt.clip_grad_norm = 1e30f;
      Setup plain = loose;
      plain.opt.clip_grad_norm = 0;
      CAPTURE(base.optimizer);
      CAPTURE(kv);
      for (int stage : {0, 1, 2}) CHECK(over_ranks(loose, stage).params == over_ranks(plain, stage).params);
      Setup u = plain;
      u.opt.clip_grad_norm = static_cast<float>(0.1 * alone(loose, 1).norms[0]);  // a tenth of step 1's norm: it clips
      const Result ref = alone(u), replicated = over_ranks(u, 0), stage1 = over_ranks(u, 1), stage2 = over_ranks(u, 2);
      CHECK(ref.norms[0] > 5 * u.opt.clip_grad_norm);
      CHECK(test::close(ref.reference, ref.norms, 0, 1e-5, "unsharded norm"));
      for (const Result* got : {&replicated, &stage1, &stage2}) {
        CHECK(test::close(ref.reference, got->norms, 0, 1e-5, "norm over the ranks"));
        CHECK(close_maps(ref.params, got->params));
        CHECK(same_on_every_rank(got->params));
        CHECK(same_on_every_rank({{"norms", std::vector<float>(got->norms.begin(), got->norms.end())}}));
      }
      CHECK(ref.params != alone(plain).params);  // clipping changed the run
      // DDP's buckets sum during backward: the step reads the sum (replicated) or its chunk (ZeRO-1).
      for (int stage : {0, 1}) {
        CAPTURE(stage);
        auto net = mlp_43();
        Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, stage), kv);
        trainer.set_buckets({0.0001, "library", true});
        std::vector<double> norms;
        train_steps(*net, trainer, 0, 20, &norms);
        CHECK(test::close(ref.reference, norms, 0, 1e-5, "norm with buckets"));
        CHECK(close_maps(ref.params, params_of(net->collect_params())));
      }
      CHECK(stage1.params == stage2.params);
      if (dist::world_size() <= 2 || kv == "dist_sync") CHECK(stage1.params == replicated.params);
      if (dist::rank() == 0)
        MESSAGE(u.optimizer << " clipped, " << kv << ", " << dist::world_size() << " ranks: ZeRO-2 and replicated have "
                            << std::string(stage2.params == replicated.params ? "the same bits" : "different last bits"));
    }
}

TEST_CASE("bytes per rank: state 4 * slots * chunk (8 * chunk for Adam), summed gradient 4 * chunk at ZeRO-2") {
  const int W = dist::world_size(), r = dist::rank();
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const int64_t slots = u.optimizer == "adam" ? 2 : 1, mine = chunk_of(kP, r, W);
    const Result replicated = over_ranks(u, 0, 1), stage1 = over_ranks(u, 1, 1), stage2 = over_ranks(u, 2, 1);
    for (const auto* res : {&replicated, &stage1, &stage2}) {
      REQUIRE(res->memory.size() == 1);  // one device per rank
      CHECK(res->memory[0].device == cpu(0));
      CHECK(res->memory[0].parameter_bytes == 4 * kP);
    }
    // The .grad buffers, measured from the tensors there are: stage 2 released them at the step.
    CHECK(replicated.memory[0].gradient_bytes == 4 * kP);
    CHECK(stage1.memory[0].gradient_bytes == 4 * kP);
    CHECK(stage2.memory[0].gradient_bytes == 0);
    CHECK(replicated.memory[0].state_bytes == 4 * slots * kP);
    CHECK(stage1.memory[0].state_bytes == 4 * slots * mine);
    CHECK(stage2.memory[0].state_bytes == 4 * slots * mine);
    CHECK(replicated.memory[0].summed_gradient_bytes == 4 * kP);
    CHECK(stage1.memory[0].summed_gradient_bytes == 4 * kP);
    CHECK(stage2.memory[0].summed_gradient_bytes == 4 * mine);
    // Every element's state kept exactly once over the ranks.
    const auto total = dist::sum_over_ranks({double(stage2.memory[0].state_bytes), double(stage2.memory[0].summed_gradient_bytes)});
    CHECK(total[0] == double(4 * slots * kP));
    CHECK(total[1] == double(4 * kP));
  }
}

TEST_CASE("a checkpoint after 10 steps, loaded into a new Trainer over the ranks, continues as 20 steps straight") {
  for (const Setup& u : {Setup{}, adam_setup()})
    for (int stage : {1, 2}) {
      CAPTURE(u.optimizer);
      CAPTURE(stage);
      const Result straight = over_ranks(u, stage);
      auto net = mlp_43();
      std::map<std::string, HostTensor> saved;
      {
        Trainer first(net->collect_params(), u.optimizer, at_stage(u.opt, stage), u.kvstore);
        train_steps(*net, first, 0, 10);
        saved = first.state_dict();
      }
      Trainer second(net->collect_params(), u.optimizer, at_stage(u.opt, stage), u.kvstore);
      second.load_state_dict(saved);
      CHECK(second.state_dict().at("num_update").values[0] == 10.0f);  // loaded, not yet placed: no collective
      train_steps(*net, second, 10, 20);
      CHECK(params_of(net->collect_params()) == straight.params);
      CHECK(state_values(second.state_dict()) == state_values(straight.state));
    }
  // A checkpoint of the unsharded run (one device, one process), placed into every rank's chunk by a
  // ZeRO-2 Trainer that continues the replicated run's parameters to 20 steps: the unsharded run's.
  const Setup u = adam_setup();
  const Result ten = alone(u, 10), twenty = alone(u, 20);
  auto net = mlp_43();
  {
    Trainer replicated(net->collect_params(), u.optimizer, u.opt, "dist_sync");
    train_steps(*net, replicated, 0, 10);
  }
  Trainer sharded(net->collect_params(), u.optimizer, at_stage(u.opt, 2), "dist_sync");
  sharded.load_state_dict(ten.state);
  train_steps(*net, sharded, 10, 20);
  CHECK(close_maps(twenty.params, params_of(net->collect_params())));
  CHECK(close_maps(state_values(twenty.state), state_values(sharded.state_dict())));
  CHECK(sharded.memory_per_device()[0].state_bytes == 8 * chunk_of(kP, dist::rank(), dist::world_size()));
  CHECK(same_on_every_rank(params_of(net->collect_params())));
}

// The reduce-scatters that ran on the communication thread while tracing.
long reduce_scatters(const std::vector<trace::Record>& events) {
  return static_cast<long>(std::count_if(events.begin(), events.end(),
                                         [](const trace::Record& e) { return e.name == "MPI_Ireduce_scatter"; }));
}

TEST_CASE("ZeRO-2 reduce-scatters each bucket during backward and releases the .grad buffers; ZeRO-1 keeps them") {
  if (dist::world_size() == 1) return;  // nothing to send
  const int W = dist::world_size(), r = dist::rank();
  using Ranges = std::vector<std::pair<size_t, size_t>>;
  // The parameters in order: weight 20, bias 5, weight 15, bias 3 elements; buckets from the back.
  const std::vector<std::pair<double, Ranges>> sizes = {
      {0.0, {{3, 4}, {2, 3}, {1, 2}, {0, 1}}}, {kSmallBucketMb, {{2, 4}, {0, 2}}}, {25.0, {{0, 4}}}};
  for (int stage : {1, 2})
    for (const auto& [mb, expected] : sizes) {
      CAPTURE(stage);
      CAPTURE(mb);
      auto net = mlp_43();
      Trainer trainer(net->collect_params(), "sgd", at_stage(Setup{}.opt, stage, mb), "dist_sync");
      train_steps(*net, trainer, 0, 1);  // the first step lays the chunks out (its gradients go at the step)
      // Stage 1 keeps every .grad buffer anyway: each is sent as it is, one parameter a bucket.
      const Ranges one_each = {{3, 4}, {2, 3}, {1, 2}, {0, 1}};
      const Ranges& sent = stage == 1 ? one_each : expected;
      CHECK(trainer.rank_shards()->buckets() == sent);
      waitall(), dist::barrier();
      trace::start();
      backward_rows(*net, 1, kGlobalBatch * r / W, kGlobalBatch * (r + 1) / W);
      waitall();
      trace::stop();
      // Before trainer.step: stage 2 has sent one reduce-scatter per bucket and kept no .grad
      // buffer; stage 1 has sent nothing and keeps every one.
      const auto params = net->collect_params().trainable();
      const long with_grad = std::count_if(params.begin(), params.end(),
                                           [](const ParameterPtr& p) { return p->list_data()[0].grad().defined(); });
      const DeviceMemory m = trainer.memory_per_device().at(0);
      if (stage == 2) {
        CHECK(reduce_scatters(trace::events()) == static_cast<long>(sent.size()));
        CHECK(with_grad == 0);
        CHECK(m.gradient_bytes == 0);
        CHECK(m.summed_gradient_bytes == 4 * chunk_of(kP, r, W));
      } else {
        CHECK(reduce_scatters(trace::events()) == 0);
        CHECK(with_grad == static_cast<long>(params.size()));
        CHECK(m.gradient_bytes == 4 * kP);
      }
      trace::start();
      trainer.step(kGlobalBatch);
      waitall();
      trace::stop();
      CHECK(reduce_scatters(trace::events()) == (stage == 2 ? 0 : static_cast<long>(sent.size())));
      // And the step gives what the replicated run gives (the same two steps at stage 0).
      auto ref = mlp_43();
      Trainer plain(ref->collect_params(), "sgd", Setup{}.opt, "dist_sync");
      train_steps(*ref, plain, 0, 2);
      CHECK(close_maps(params_of(ref->collect_params()), params_of(net->collect_params())));
    }
}

TEST_CASE("the step over the ranks updates each whole parameter in place: what it allocates is the chunk's sum and the shared parts") {
  // The step's own allocations, measured: the allocator's peak during step() over what was in use
  // before it. The update reads the chunk's summed gradient as one tensor a part (4 * chunk bytes):
  // at stage 1 it arrives there during the step; at stage 2 backward left it in one flat tensor, which
  // the parts copy. Besides it the step holds only buffers of the size of the parts
  // of the (at most two) parameters its chunk shares with a neighbour's: their values' copies and
  // what moves them, three of each at the most. A copy of the whole chunk's values (a step that
  // updates a flat copy and gathers from it) is 4 * chunk more: over 2 ranks, where a chunk shares
  // 1 and 4 of its 21 and 22 elements, that exceeds the bound.
  const int W = dist::world_size(), r = dist::rank();
  const int64_t lo = kP * r / W, hi = kP * (r + 1) / W, chunk = hi - lo;
  const std::vector<int64_t> sizes{20, 5, 15, 3};  // mlp_43's parameters, in the Trainer's order
  int64_t shared = 0;  // elements of this chunk in parameters it does not hold whole
  for (int64_t k = 0, at = 0; k < int64_t(sizes.size()); at += sizes[size_t(k)], ++k)
    if ((at < lo && at + sizes[size_t(k)] > lo) || (at < hi && at + sizes[size_t(k)] > hi))
      shared += std::min(hi, at + sizes[size_t(k)]) - std::max(lo, at);
  for (const Setup& u : {Setup{}, adam_setup()})
    for (int stage : {1, 2}) {
      CAPTURE(u.optimizer);
      CAPTURE(stage);
      auto net = mlp_43();
      Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, stage, 0), u.kvstore);
      train_steps(*net, trainer, 0, 2);  // laid out, every buffer made once
      backward_rows(*net, 2, kGlobalBatch * r / W, kGlobalBatch * (r + 1) / W);
      DeviceRuntime& rt = runtime(cpu(0));
      Allocator& a = *rt.allocator;
      rt.compute.synchronize(), rt.copy.synchronize();
      const int64_t before = a.stats().in_use;
      a.reset_peak();
      trainer.step(kGlobalBatch);
      rt.compute.synchronize(), rt.copy.synchronize();
      const int64_t extra = a.stats().peak - before;
      CHECK(extra <= 4 * chunk + 3 * 4 * shared);
    }
}

TEST_CASE("every bucket size gives the same bits at ZeRO-1 and ZeRO-2, SGD with momentum and Adam") {
  for (const Setup& u : {Setup{}, adam_setup()})
    for (int stage : {1, 2}) {
      CAPTURE(u.optimizer);
      CAPTURE(stage);
      const Result one = over_ranks(u, stage, 20, 0.0), small = over_ranks(u, stage, 20, kSmallBucketMb),
                   whole = over_ranks(u, stage, 20, 25.0);
      CHECK(one.params == whole.params);
      CHECK(small.params == whole.params);
      CHECK(state_values(one.state) == state_values(whole.state));
      CHECK(state_values(small.state) == state_values(whole.state));
      CHECK(one.params != params_of(mlp_43()->collect_params()));  // they trained
    }
}

TEST_CASE("bytes sent per rank, read from the collective counters: (W-1)/W * 2 * 4 P a step at ZeRO-1 and ZeRO-2") {
  const int W = dist::world_size();
  constexpr int kSteps = 20;
  // The paper's volume per rank and step, Psi = 4 P bytes: 2 Psi (W-1)/W (a reduce-scatter and an
  // all-gather, or an allreduce); with DDP's buckets ZeRO-1 all-reduces, then all-gathers: 3 Psi (W-1)/W.
  const double psi = 4.0 * kP, fraction = double(W - 1) / W;
  struct Run {
    int stage;
    double bucket_mb;
    bool ddp;
    double volumes;  // Psi's a step
  };
  for (const Setup& u : {Setup{}, adam_setup()})
    for (const Run& run : {Run{0, 25, false, 2}, Run{1, 0, false, 2}, Run{1, 25, false, 2}, Run{1, 25, true, 3},
                           Run{2, 0, false, 2}, Run{2, kSmallBucketMb, false, 2}, Run{2, 25, false, 2}}) {
      CAPTURE(u.optimizer);
      CAPTURE(run.stage);
      CAPTURE(run.bucket_mb);
      CAPTURE(run.ddp);
      auto net = mlp_43();
      Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, run.stage, run.bucket_mb), "dist_sync");
      if (run.ddp) trainer.set_buckets({0.0001, "library", true});
      waitall();
      dist::reset_collective_counters();
      train_steps(*net, trainer, 0, kSteps);
      waitall();
      const dist::CollectiveCounters c = dist::collective_counters();
      const double mine = double(c.allreduce.sent_bytes + c.reduce_scatter.sent_bytes + c.allgather.sent_bytes) / kSteps;
      const double total = dist::sum_over_ranks({mine})[0];
      CHECK(total == run.volumes * psi * (W - 1));  // exact: the chunks add up to P
      // Per rank the uneven chunks (a call's chunk c_r is n/W give or take less than one element)
      // move it from the average: by under 1 element a reduce-scatter, W-1 an all-gather (c_r sent
      // to W-1 ranks), W-2 an allreduce. At most 4 (W-1) bytes a call.
      const double calls = double(c.allreduce.calls + c.reduce_scatter.calls + c.allgather.calls) / kSteps;
      CHECK(std::fabs(mine - run.volumes * psi * fraction) <= 4.0 * (W - 1) * calls);
      if (W == 1 || run.stage == 0) continue;
      CHECK(c.allgather.calls == kSteps * 4);  // a step all-gathers each of the 4 parameters into its tensor
      if (run.ddp) {
        CHECK(c.reduce_scatter.calls == 0);
        CHECK(c.allreduce.calls > 0);
      } else {
        CHECK(c.allreduce.calls == 0);  // no allreduce: a reduce-scatter per bucket instead
        const int64_t buckets = run.bucket_mb == 0 || run.stage == 1 ? 4 : run.bucket_mb == kSmallBucketMb ? 2 : 1;
        CHECK(c.reduce_scatter.calls == kSteps * buckets);
        CHECK(c.reduce_scatter.input_bytes == kSteps * 4 * kP);  // every rank hands over its whole gradient
      }
      if (dist::rank() == 0)
        MESSAGE("zero_stage " << run.stage << std::string(run.ddp ? " with DDP's buckets" : "") << ", bucket " << run.bucket_mb
                              << " MiB, " << W << " ranks: " << mine << " bytes sent by rank 0 a step, "
                              << total / W << " on average; formula " << run.volumes << " * 4 P (W-1)/W = "
                              << run.volumes * psi * fraction);
    }
}

TEST_CASE("ZeRO-2 with two backward passes before each step: the replicated run's sums") {
  const int W = dist::world_size(), r = dist::rank();
  const int64_t lo = kGlobalBatch * r / W, hi = kGlobalBatch * (r + 1) / W, mid = (lo + hi) / 2;
  for (double mb : {0.0, kSmallBucketMb, 25.0}) {
    CAPTURE(mb);
    auto ref = mlp_43(), net = mlp_43();
    Trainer plain(ref->collect_params(), "adam", adam_setup().opt, "dist_sync");
    Trainer sharded(net->collect_params(), "adam", at_stage(adam_setup().opt, 2, mb), "dist_sync");
    for (int s = 0; s < 6; ++s)
      for (auto [n, t] : {std::pair{ref.get(), &plain}, std::pair{net.get(), &sharded}}) {
        backward_rows(*n, s, lo, mid);
        backward_rows(*n, s, mid, hi);
        t->step(kGlobalBatch);
      }
    CHECK(close_maps(params_of(ref->collect_params()), params_of(net->collect_params())));
    CHECK(same_on_every_rank(params_of(net->collect_params())));
  }
}

TEST_CASE("ZeRO over the ranks: configuration errors before any collective") {
  // Parameters on different devices: one chunk needs one list of devices for every parameter.
  {
    auto a = std::make_shared<Dense>(kOut, "", true, kIn), b = std::make_shared<Dense>(kOut, "", true, kIn);
    a->initialize(Init::Xavier(), {cpu(0), cpu(1)});
    b->initialize(Init::Xavier(), {cpu(0)});
    ParameterDict params = a->collect_params();
    for (auto& [name, p] : b->collect_params()) params.add("b" + name, p);
    Trainer trainer(params, "adam", {.learning_rate = 0.01f, .zero_stage = 1}, "dist_sync");
    CHECK_THROWS_WITH_AS(trainer.step(1), doctest::Contains("on the same devices"), ConfigError);
  }
  // Stage 2 reduce-scatters: buckets that all-reduce during backward are refused.
  {
    auto net = mlp_43();
    Trainer trainer(net->collect_params(), "sgd", {.learning_rate = 0.1f, .zero_stage = 2}, "dist_sync");
    CHECK_THROWS_WITH_AS(trainer.set_buckets({}), doctest::Contains("zero_stage 2"), ConfigError);
  }
  // A bucket size below zero.
  {
    auto net = mlp_43();
    CHECK_THROWS_WITH_AS(Trainer(net->collect_params(), "sgd", at_stage(Setup{}.opt, 2, -1.0), "dist_sync"),
                         doctest::Contains("reduce_bucket_mb"), ConfigError);
  }
  // Stage 1 with buckets (they all-reduce during backward; the step reads its chunk of the sum).
  const Setup u = adam_setup();
  const Result ref = alone(u);
  auto net = mlp_43();
  Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
  trainer.set_buckets({0.0001, "library", true});
  train_steps(*net, trainer, 0, 20);
  CHECK(close_maps(ref.params, params_of(net->collect_params())));
  CHECK(same_on_every_rank(params_of(net->collect_params())));
}

namespace {

// Hybrid sharding's run: each rank's h devices (2 by default) take h parts of its rows of every
// global batch; the Trainer sharding over `over` (or stage 0 over the same devices: the replicated
// reference). held[i]: the optimizer state device i holds after the run, sums[i] the summed
// gradients it keeps between steps, both measured by the allocator's tags; copied_in[i] and
// copied_out[i]: the bytes copied into and out of device i from and to the rank's other devices
// during the last step (its backward and the step), read from the copy counters.
struct HybridRun {
  Values params;
  std::vector<int64_t> held, sums, copied_in, copied_out;
  std::vector<double> norms;  // last_grad_norm() after every step
};
HybridRun hybrid(const Setup& u, int stage, ShardOver over, int h = 2) {
  std::vector<Device> on;
  for (int i = 0; i < h; ++i) on.push_back(cpu(i));
  use_devices(on);
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Dense>(kHidden, "relu", true, kIn), std::make_shared<Dense>(kOut, "", true, kHidden));
  manual_seed(42);  // mlp_43's values, now on every device
  net->initialize(Init::Xavier(), on);
  auto state_on = [](Device d) { return runtime(d).allocator->stats().held(MemoryTag::optimizer_state); };
  auto sums_on = [](Device d) { return runtime(d).allocator->stats().held(MemoryTag::summed_gradients); };
  std::vector<int64_t> before, sums_before;
  for (Device d : on) before.push_back(state_on(d)), sums_before.push_back(sums_on(d));
  OptimizerOptions o = at_stage(u.opt, stage);
  o.shard_over = over;
  HybridRun out;
  {
    Trainer trainer(net->collect_params(), u.optimizer, o, u.kvstore);
    const int parts = h * dist::world_size();
    constexpr int kSteps = 20;
    for (int s = 0; s < kSteps; ++s) {
      if (s == kSteps - 1) {
        waitall();
        reset_copy_counters();
      }
      for (int i = 0; i < h; ++i) {  // device i: part h r + i of the global batch
        const int q = h * dist::rank() + i;
        const auto X = test::lcg_data(kGlobalBatch * kIn, 700 + static_cast<uint32_t>(s));
        const int64_t lo = kGlobalBatch * q / parts, hi = kGlobalBatch * (q + 1) / parts;
        std::vector<int32_t> y;
        for (int64_t k = lo; k < hi; ++k) y.push_back((X[k * kIn] > 0) + (X[k * kIn + 1] > 0));
        if (hi == lo) continue;
        Tensor Xt = Tensor::from_vector(std::vector<float>(X.begin() + lo * kIn, X.begin() + hi * kIn), {hi - lo, kIn}, on[i]);
        softmax_cross_entropy((*net)(Xt), Tensor::from_vector(y, {hi - lo}, on[i]), Reduction::sum).backward();
      }
      trainer.step(kGlobalBatch);
      out.norms.push_back(trainer.last_grad_norm());
    }
    waitall();  // what the devices' queued work still holds is returned first
    for (int i = 0; i < h; ++i) {
      out.held.push_back(state_on(on[i]) - before[i]), out.sums.push_back(sums_on(on[i]) - sums_before[i]);
      out.copied_in.push_back(copy_counters(on[i]).bytes_in), out.copied_out.push_back(copy_counters(on[i]).bytes_out);
    }
  }
  out.params = params_of(net->collect_params());
  use_devices({cpu(0)});
  return out;
}

}  // namespace

TEST_CASE("hybrid sharding: ZeRO-1 and ZeRO-2 over the ranks, each process's devices, or every device of every rank, equal one process") {
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const Result ref = alone(u);
    const HybridRun replicated = hybrid(u, 0, ShardOver::ranks);
    CHECK(close_maps(ref.params, replicated.params));
    for (int stage : {1, 2}) {
      CAPTURE(stage);
      // The reverse: sharded over the ranks, replicated over each process's devices. The rank's chunk
      // of the state lives on its first device, none on the second.
      const HybridRun reverse = hybrid(u, stage, ShardOver::ranks);
      CHECK(close_maps(ref.params, reverse.params));
      CHECK(same_on_every_rank(reverse.params));
      const int64_t slots = u.optimizer == "adam" ? 2 : 1;
      CHECK(reverse.held[0] == slots * 4 * chunk_of(kP, dist::rank(), dist::world_size()));
      CHECK(reverse.held[1] == 0);
      // Between steps stage 2 keeps the summed gradient of what each device updates, stage 1 none.
      const int64_t sum_bytes = stage == 2 ? 4 : 0;
      CHECK(reverse.sums[0] == sum_bytes * chunk_of(kP, dist::rank(), dist::world_size()));
      CHECK(reverse.sums[1] == 0);
      const HybridRun h = hybrid(u, stage, ShardOver::devices);
      CHECK(close_maps(ref.params, h.params));
      CHECK(same_on_every_rank(h.params));
      // Device i keeps the state of shard i of the 43 elements (21 and 22), on every rank: slots * 4 bytes each.
      CHECK(h.held[0] == slots * 4 * 21);
      CHECK(h.held[1] == slots * 4 * 22);
      CHECK(h.sums[0] == sum_bytes * 21);
      CHECK(h.sums[1] == sum_bytes * 22);
      // Every device of every rank its own shard: device i of rank r keeps shard 2 r + i of 2 W.
      const HybridRun all = hybrid(u, stage, ShardOver::all_devices);
      CHECK(close_maps(ref.params, all.params));
      CHECK(same_on_every_rank(all.params));
      for (int i = 0; i < 2; ++i) {  // its own piece's sum too, not the rank's chunk on the first device
        CHECK(all.held[i] == slots * 4 * chunk_of(kP, 2 * dist::rank() + i, 2 * dist::world_size()));
        CHECK(all.sums[i] == sum_bytes * chunk_of(kP, 2 * dist::rank() + i, 2 * dist::world_size()));
      }
      CHECK(replicated.held[0] + replicated.held[1] == 2 * slots * 4 * kP);  // stage 0: a whole copy per device
      // Two ranks add a + b whatever the split: stage 1 has the replicated run's bits.
      if (stage == 1 && dist::world_size() <= 2) CHECK(h.params == replicated.params);
    }
  }
  // Sharding over devices needs a dist kvstore; over each process's devices (replicated over the
  // ranks) it takes no buckets.
  auto net = mlp_43();
  for (ShardOver over : {ShardOver::devices, ShardOver::all_devices})
    CHECK_THROWS_WITH_AS(Trainer(net->collect_params(), "sgd", {.zero_stage = 1, .shard_over = over}, "device"),
                         doctest::Contains("shard_over"), ConfigError);
  Trainer trainer(net->collect_params(), "sgd", {.zero_stage = 1, .shard_over = ShardOver::devices}, "dist_sync");
  CHECK_THROWS_WITH_AS(trainer.set_buckets({}), doctest::Contains("shard_over devices"), ConfigError);
}

TEST_CASE("3 devices a rank, every device its own shard: the devices reduce-scatter and all-gather among themselves, "
          "no device gathers the others' gradients") {
  // Device j of every rank holds D_j elements in all (its piece of every rank's chunk). Per step it
  // receives from each of the other 2 devices its sum of those D_j elements (the devices'
  // reduce-scatter, before the ranks'), then every element it does not hold (the all-gather):
  // 4 (2 D_j + P - D_j) bytes, and as many go out. Summing on the first device would bring it 2 P.
  // (Every device needs rows of the batch for this count: up to 2 ranks, 6 parts of 8 rows.)
  constexpr int h = 3;
  const int W = dist::world_size();
  if (h * W > kGlobalBatch) {
    MESSAGE("3 devices a rank: run with 1 or 2 ranks (" << kGlobalBatch << " rows for " << h * W << " devices)");
    return;
  }
  const Setup u;
  const Result ref = alone(u);
  for (int stage : {1, 2}) {
    CAPTURE(stage);
    const HybridRun all = hybrid(u, stage, ShardOver::all_devices, h);
    CHECK(close_maps(ref.params, all.params));
    CHECK(same_on_every_rank(all.params));
    for (int j = 0; j < h; ++j) {
      CAPTURE(j);
      int64_t D = 0;
      for (int r = 0; r < W; ++r) D += chunk_of(kP, h * r + j, h * W);
      CHECK(all.copied_in[j] == 4 * ((h - 1) * D + kP - D));
      CHECK(all.copied_out[j] == 4 * ((h - 1) * D + kP - D));
      CHECK(all.held[j] == 4 * chunk_of(kP, h * dist::rank() + j, h * W));
    }
  }
}

TEST_CASE("clip_grad_norm with 2 devices a rank: every layout clips by the whole summed gradient's norm, as the unsharded run") {
  for (const Setup& base : {Setup{}, adam_setup()}) {
    CAPTURE(base.optimizer);
    Setup loose = base;
    loose.opt.clip_grad_norm = 1e30f;
    Setup u = base;
    u.opt.clip_grad_norm = static_cast<float>(0.1 * alone(loose, 1).norms[0]);  // a tenth of step 1's norm: it clips
    const Result ref = alone(u);
    CHECK(ref.norms[0] > 5 * u.opt.clip_grad_norm);
    CHECK(ref.params != alone(base).params);  // clipping changed the run
    std::vector<std::pair<int, ShardOver>> runs{{0, ShardOver::ranks}};
    for (int stage : {1, 2})
      for (ShardOver over : {ShardOver::ranks, ShardOver::all_devices, ShardOver::devices}) runs.push_back({stage, over});
    for (auto [stage, over] : runs) {
      CAPTURE(stage);
      CAPTURE(shard_over_name(over));
      const HybridRun h = hybrid(u, stage, over);
      CHECK(test::close(ref.reference, h.norms, 0, 1e-5, "norm with 2 devices a rank"));
      CHECK(close_maps(ref.params, h.params));
      CHECK(same_on_every_rank(h.params));
    }
  }
}

namespace {

// This rank's rows of step s's global batch, the loss multiplied by the scaler's scale; bad: the
// last rank's first input is an inf (its gradients inf or NaN, every other rank's finite).
void scaled_backward(Sequential& net, const GradScaler& scaler, int s, bool bad) {
  const int W = dist::world_size(), r = dist::rank();
  const int64_t lo = kGlobalBatch * r / W, hi = kGlobalBatch * (r + 1) / W;
  const auto X = lcg_data(kGlobalBatch * kIn, 700 + static_cast<uint32_t>(s));  // backward_rows' batch
  std::vector<float> rows(X.begin() + lo * kIn, X.begin() + hi * kIn);
  std::vector<int32_t> y;
  for (int64_t i = lo; i < hi; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  if (bad && r == W - 1) rows[0] = INFINITY;
  Tensor l = softmax_cross_entropy(net(Tensor::from_vector(rows, {hi - lo, kIn}, cpu(0))),
                                   Tensor::from_vector(y, {hi - lo}, cpu(0)), Reduction::sum);
  scaler.scale(l).backward();
}

}  // namespace

TEST_CASE("loss scaling over the ranks: an inf in one rank's gradients skips the step on every rank") {
  // Steps 0 to 4 with batch 2 spoiled on the last rank, against the run that never saw batch 2.
  struct Way {
    std::string kvstore;
    int stage;
    double bucket_mb;  // DDP's buckets (set_buckets), or 0: none
  };
  for (const Setup& base : {Setup{}, adam_setup()})
    for (const Way& way : {Way{"dist_sync", 0, 0}, Way{"dist_sync", 1, 0}, Way{"dist_sync", 2, 0},
                           Way{"dist_sync_ring", 2, 0}, Way{"dist_sync", 0, kSmallBucketMb},
                           Way{"dist_sync", 1, kSmallBucketMb}, Way{"device", 0, 0}}) {
      // kvstore 'device': each rank alone, nothing summed over the ranks but found_inf over the
      // tp_group (tensor parallelism's group: the world here)
      OptimizerOptions opt = at_stage(base.opt, way.stage);
      if (way.kvstore == "device") opt.tp_group = dist::Group();
      CAPTURE(base.optimizer);
      CAPTURE(way.kvstore);
      CAPTURE(way.stage);
      CAPTURE(way.bucket_mb);
      auto ref = mlp_43(), net = mlp_43();
      Trainer ref_trainer(ref->collect_params(), base.optimizer, opt, way.kvstore);
      Trainer trainer(net->collect_params(), base.optimizer, opt, way.kvstore);
      if (way.bucket_mb > 0) {
        ref_trainer.set_buckets({way.bucket_mb, "library", true});
        trainer.set_buckets({way.bucket_mb, "library", true});
      }
      GradScaler scaler;
      GradScaler unscaled({.init_scale = 1.0f});  // the reference's: a scale of 1, no inf ever
      bool skipped_here = false, stepped_elsewhere = true;
      for (int s = 0; s < 5; ++s) {
        if (s != 2) {
          scaled_backward(*ref, unscaled, s, false);
          ref_trainer.step(kGlobalBatch);
        }
        scaled_backward(*net, scaler, s, s == 2);
        const Values before = params_of(net->collect_params());
        const bool stepped = scaler.step(trainer, kGlobalBatch);
        scaler.update();
        if (s == 2) skipped_here = !stepped && params_of(net->collect_params()) == before;
        else stepped_elsewhere = stepped_elsewhere && stepped;
      }
      CHECK(skipped_here);
      CHECK(stepped_elsewhere);
      CHECK(scaler.get_scale() == 32768.0f);
      CHECK(scaler.skipped_steps() == 1);
      CHECK(trainer.num_update() == 4);
      CHECK(params_of(net->collect_params()) == params_of(ref->collect_params()));
      CHECK(state_values(trainer.state_dict()) == state_values(ref_trainer.state_dict()));
      if (way.kvstore != "device") CHECK(same_on_every_rank(params_of(net->collect_params())));
    }
}
