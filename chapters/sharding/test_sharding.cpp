// Chapter 5's parts as functions, beside the program's shell checks: run as one process and under
// mpirun as 2 (tests/dist/mpirun.sh). The --quick sizes throughout.
//   - part 1 in one process on 1, 2 and 4 CPU devices: every device's bytes, measured from the
//     allocator's tags after the last step, equal to the ZeRO paper's model written out here from Psi
//     (the MLP's sizes) and N; the bytes a device holds between steps fall stage by stage (the
//     paper's ladder, strictly at N = 4, stage 3 at 1/N of replicated); at N = 1 every stage holds
//     what replication holds; every sharded run's parameters equal the replicated run's; the bytes
//     sent per step equal 2 (N-1) 4 Psi at stages 0 to 2 and 3 (N-1) 4 Psi at stage 3;
//   - part 1 over the ranks (2 processes): the same per rank, the chunks dist::chunk_begin's, stage
//     3's per unit, and stage 2 below stage 1;
//   - part 2: the split MLP equal to the unsharded one (bit for bit at --tp-size 1), f and g's two
//     allreduces of batch x d_model, and with clipping the norms over the slices equal to the
//     unsharded model's;
//   - each part's own flags refused in one ConfigError line.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "chapters/sharding/sharding.hpp"
#include "core/dist/process_group.hpp"
#include "tests/one_line_error.hpp"

using namespace d2l;
namespace sh = d2l::sharding;

namespace {

sh::Config quick(int devices) {
  sh::Config c;
  sh::make_quick(c);
  c.verbose = false;
  for (int i = 0; i < devices; ++i) c.devices.push_back(cpu(i));
  sh::load_data(c);
  return c;
}

// Part 1's MLP: 784 -> zero_hidden, zero_layers - 1 more of zero_hidden, -> 10; a unit per Dense.
std::vector<int64_t> unit_sizes(const sh::Config& c) {
  const int64_t h = c.zero_hidden;
  std::vector<int64_t> units{784 * h + h};
  for (int l = 1; l < c.zero_layers; ++l) units.push_back(h * h + h);
  units.push_back(h * 10 + 10);
  return units;
}

int64_t psi_of(const sh::Config& c) {
  int64_t psi = 0;
  for (int64_t u : unit_sizes(c)) psi += u;
  return psi;
}

// Elements of n that holder i of N keeps, devices and ranks alike: floor(n (i+1) / N) - floor(n i / N).
int64_t chunk(int64_t n, int i, int N) { return n * (i + 1) / N - n * i / N; }

// What a device (rank) holds between steps, Adam: its parameters, .grad buffers, summed gradient, state.
int64_t held(const sh::MemoryRow& m) { return m.parameter_bytes + m.gradient_bytes + m.summed_gradient_bytes + m.state_bytes; }

const sh::ZeroRun& run_of(const sh::ZeroResult& r, int n, int stage) {
  for (const auto& run : r.runs)
    if (run.n == n && run.stage == stage) return run;
  FAIL("no run at N = " << n << ", stage " << stage);
  return r.runs.front();
}

}  // namespace

TEST_CASE("part 1 in one process: measured bytes against the paper's model, the ladder, the same parameters") {
  if (dist::world_size() > 1) return;
  sh::Config c = quick(4);
  const sh::ZeroResult r = sh::zero_memory(c);
  const int64_t psi = psi_of(c);
  CHECK(r.psi == psi);
  CHECK(sh::zero_device_counts(4) == std::vector<int>{1, 2, 4});
  REQUIRE(r.runs.size() == 3 * 4);
  for (const sh::ZeroRun& run : r.runs) {
    CAPTURE(run.n);
    CAPTURE(run.stage);
    REQUIRE(run.rows.size() == static_cast<size_t>(run.n));
    for (int i = 0; i < run.n; ++i) {
      const sh::MemoryRow& m = run.rows[static_cast<size_t>(i)];
      const int64_t shard = chunk(psi, i, run.n);  // the one flat vector over the devices
      CHECK(m.parameter_bytes == 4 * (run.stage == 3 ? shard : psi));
      CHECK(m.gradient_bytes == (run.stage >= 2 ? 0 : 4 * psi));
      CHECK(m.summed_gradient_bytes == (run.stage >= 2 ? 4 * shard : 0));
      CHECK(m.state_bytes == 8 * (run.stage == 0 ? psi : shard));
    }
    if (run.stage > 0) CHECK(run.max_diff_to_replicated == 0);
    CHECK(run.sent_bytes == (run.stage == 3 ? 3 : 2) * (run.n - 1) * 4 * psi);
  }
  // Between steps, device 0: at N = 1 every stage holds what replication holds; at N = 4 each stage
  // holds less than the one before, and stage 3 a quarter of replication (16 Psi / N against 16 Psi).
  for (int stage = 1; stage <= 3; ++stage) CHECK(held(run_of(r, 1, stage).rows[0]) == held(run_of(r, 1, 0).rows[0]));
  for (int stage = 1; stage <= 3; ++stage)
    CHECK(held(run_of(r, 4, stage).rows[0]) < held(run_of(r, 4, stage - 1).rows[0]));
  CHECK(held(run_of(r, 4, 3).rows[0]) == 16 * chunk(psi, 0, 4));
  CHECK(held(run_of(r, 4, 0).rows[0]) == 16 * psi);
}

TEST_CASE("part 1 over the ranks: each rank's bytes against its chunk, stage 2 below stage 1, every rank the same parameters") {
  const int W = dist::world_size();
  if (W == 1) return;
  sh::Config c = quick(1);
  const sh::ZeroRanksResult r = sh::zero_memory_over_ranks(c);
  const int64_t psi = psi_of(c);
  for (double d : r.diff_to_rank0) CHECK(d == 0);
  for (const sh::ZeroRun& run : r.zero.runs) {
    CAPTURE(run.stage);
    REQUIRE(run.rows.size() == static_cast<size_t>(W));
    for (int q = 0; q < W; ++q) {
      const sh::MemoryRow& m = run.rows[static_cast<size_t>(q)];
      int64_t mine = chunk(psi, q, W);  // stages 1 and 2: one flat vector; stage 3: each unit's own
      if (run.stage == 3) {
        mine = 0;
        for (int64_t u : unit_sizes(c)) mine += chunk(u, q, W);
      }
      CHECK(m.parameter_bytes == 4 * (run.stage == 3 ? mine : psi));
      CHECK(m.gradient_bytes == (run.stage >= 2 ? 0 : 4 * psi));
      CHECK(m.summed_gradient_bytes == (run.stage >= 2 ? 4 * mine : 0));
      CHECK(m.state_bytes == 8 * (run.stage == 0 ? psi : mine));
    }
    if (run.stage > 0) CHECK(run.max_diff_to_replicated == 0);
  }
  for (int stage = 1; stage <= 3; ++stage)
    CHECK(held(run_of(r.zero, W, stage).rows[0]) < held(run_of(r.zero, W, stage - 1).rows[0]));
}

TEST_CASE("part 2: the split MLP against the unsharded one, f and g's bytes, clipping over the slices") {
  if (dist::world_size() > 1) return;
  for (int tp : {1, 2, 4}) {
    CAPTURE(tp);
    sh::Config c = quick(4);
    c.tp_size = tp;
    c.num_epochs = 1;
    c.clip_grad_norm = 0.1f;
    const sh::TensorParallelResult r = sh::tensor_parallel(c);
    REQUIRE(r.sharded_steps.size() == r.unsharded_steps.size());
    REQUIRE(r.sharded_norms.size() == r.unsharded_norms.size());
    REQUIRE(r.sharded_norms.size() == r.sharded_steps.size());
    for (size_t k = 0; k < std::min<size_t>(10, r.sharded_steps.size()); ++k) {
      if (tp == 1) {  // the same sums in the same order: the same bits
        CHECK(r.sharded_steps[k] == r.unsharded_steps[k]);
        CHECK(r.sharded_norms[k] == r.unsharded_norms[k]);
      } else {
        CHECK(std::fabs(r.sharded_steps[k] - r.unsharded_steps[k]) <= 1e-5 * std::fabs(r.unsharded_steps[k]));
        CHECK(std::fabs(r.sharded_norms[k] - r.unsharded_norms[k]) <= 1e-5 * r.unsharded_norms[k]);
      }
    }
    CHECK(r.unsharded_norms[0] > 0.1);  // the first step is clipped
    CHECK(r.allreduces_per_step == 2);  // f's backward and g's forward, over a group of one too
    CHECK(r.bytes_per_step == 2 * r.step_batch * c.d_model * 4);
  }
}

TEST_CASE("--precision bf16 and fp16: float32 master weights hold part 1's bytes, every stage the replicated run's bits; "
          "part 2 within the 16-bit rounding") {
  if (dist::world_size() > 1) return;
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    sh::Config c = quick(2);
    c.autocast = t;
    const sh::ZeroResult r = sh::zero_memory(c);
    const int64_t psi = psi_of(c);
    REQUIRE(r.runs.size() == 2 * 4);
    for (const sh::ZeroRun& run : r.runs) {
      CAPTURE(run.n);
      CAPTURE(run.stage);
      for (int i = 0; i < run.n; ++i) {  // between steps autocast holds nothing: float32's bytes
        const sh::MemoryRow& m = run.rows[static_cast<size_t>(i)];
        const int64_t shard = chunk(psi, i, run.n);
        CHECK(m.parameter_bytes == 4 * (run.stage == 3 ? shard : psi));
        CHECK(m.state_bytes == 8 * (run.stage == 0 ? psi : shard));
      }
      if (run.stage > 0) CHECK(run.max_diff_to_replicated == 0);
      CHECK(run.sent_bytes == run.formula_sent_bytes);
      if (t == DType::bf16) CHECK(run.skipped == 0);  // bfloat16 has no scaler
      // A skipped step at stage 1 or 2 all-gathers nothing: fewer bytes than float32's 2(N-1) 4 Psi.
      if (run.n == 2 && (run.stage == 1 || run.stage == 2) && run.skipped > 0)
        CHECK(run.sent_bytes < 2 * 4 * psi);
    }
    c.tp_size = 2;
    c.num_epochs = 1;
    const sh::TensorParallelResult tp = sh::tensor_parallel(c);
    for (size_t k = 0; k < std::min<size_t>(10, tp.sharded_steps.size()); ++k)
      CHECK(std::fabs(tp.sharded_steps[k] - tp.unsharded_steps[k]) <= sh::rounding_tolerance(t) * std::fabs(tp.unsharded_steps[k]));
  }
}

TEST_CASE("each part's own flags, refused in one ConfigError line") {
  if (dist::world_size() > 1) return;
  sh::Config c = quick(4);
  auto refused = [](const sh::Config& bad, const char* names) {
    test::check_one_line_error<ConfigError>([&] { sh::validate(bad), sh::validate_short_batch(bad); }, names);
  };
  CHECK_NOTHROW(sh::validate(c));
  sh::Config b = c;
  b.zero_stage = 4;
  refused(b, "--zero-stage");
  b = c, b.batch_size = 3;
  refused(b, "--batch-size");
  b = c, b.tp_size = 5;
  refused(b, "--tp-size");
  b = c, b.tp_size = 3;  // 256 hidden units do not split over 3
  refused(b, "--hidden");
  b = c, b.batch_size = 1022;  // 1024 examples: a last minibatch of 2 for 4 devices
  refused(b, "--batch-size 1022");
  b = c, b.devices = {cpu(0), emu(0)};
  refused(b, "--devices");
  CHECK(sh::classifier_bytes(c, 784, 1, false) > 0);
}
