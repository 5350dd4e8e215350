// Sharded checkpoints (core/checkpoint/sharded_checkpoint.hpp), run as 1, 2 and 4 processes
// (tests/dist/mpirun.sh), and 3 in the plain run. The small MLP of tests/dist/zero_mlp.hpp (P = 43,
// uneven chunks, parameters straddling them), rank r taking its rows of every global batch.
//   - at stages 0, 1 and 2, SGD with momentum and Adam: 5 steps, save, 5 more steps is the reference;
//     a fresh net and Trainer that load the directory and take the same 5 steps match it bit for bit
//     (parameters and state_dict), and the epoch comes back;
//   - resharding: a directory written at W ranks by ZeRO-2 loads into a replicated Trainer of one
//     process's view (kvstore 'device'): the same state_dict as the sharded Trainer's gathered one,
//     and the same parameters; into ZeRO-2 over N = 1, 2 and 4 devices of one process, laid out over
//     them at the next step, which continues as the replicated one does;
//   - the files: one per rank, an index naming them;
//   - bad directories (a rank's file missing, truncated, stale, from another save, damaged; the
//     parameters file of another save; a net with other parameters; no index): every rank throws the
//     same one-line ConfigError naming the file, and the trainer and the parameters are unchanged. (A
//     hang would fail the mpirun wrapper's time limit.)
//   - ZeRO-3 (FullyShardedDataParallel over the ranks): saved from the shards, loaded into a fresh
//     FSDP's shards it continues bit for bit; loaded at ZeRO-1, the parameters and state of the save;
//   - separate runs (tests/dist/resume_runs.sh): saved by a run of 2 or 4 ranks, resumed by a run of
//     1, 2, 3 or 4, continuing as 10 steps straight.
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <fstream>
#include <map>

#include "check.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/checkpoint/sharded_checkpoint.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "tests/dist/zero_mlp.hpp"

using namespace d2l;
using namespace d2l::nn;
using namespace d2l::optim;
using namespace d2l::test;
namespace fs = std::filesystem;

namespace {

// A directory every rank agrees on: rank 0's process id in the system's temporary directory.
std::string shared_dir(const std::string& tag) {
  int64_t pid = static_cast<int64_t>(::getpid());
  dist::broadcast_bytes(&pid, sizeof pid, 0);
  return (fs::temp_directory_path() / ("d2l_sharded_" + std::to_string(pid) + "_" + tag)).string();
}

// Step s's whole global batch (tests/dist/zero_mlp.hpp's), split over the devices, through `run`
// (the net's forward_shards, or FullyShardedDataParallel's), then the step.
using Run = std::function<std::vector<Tensor>(const std::vector<Tensor>&)>;
void step_on_devices(const Run& run, Trainer& trainer, const std::vector<Device>& devices, int s) {
  const auto X = lcg_data(kGlobalBatch * kIn, 700 + static_cast<uint32_t>(s));
  std::vector<int32_t> y;
  for (int64_t i = 0; i < kGlobalBatch; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
  const auto outs = run(split_and_load(X, {kGlobalBatch, kIn}, devices, false));
  const auto ys = split_and_load(y, {kGlobalBatch}, devices, false);
  std::vector<Tensor> losses;
  for (size_t i = 0; i < outs.size(); ++i) losses.push_back(softmax_cross_entropy(outs[i], ys[i], Reduction::sum));
  for (auto& l : losses) l.backward();
  trainer.step(kGlobalBatch);
}

void remove_dir(const std::string& dir) {
  dist::barrier();
  if (dist::rank() == 0) fs::remove_all(dir);
  dist::barrier();
}

}  // namespace

TEST_CASE("a sharded checkpoint after 5 steps, loaded by a fresh net and Trainer, continues bit for bit") {
  const int W = dist::world_size();
  for (const Setup& u : {Setup{}, adam_setup()})
    for (int stage : {0, 1, 2}) {
      CAPTURE(u.optimizer);
      CAPTURE(stage);
      const std::string dir = shared_dir("continue");
      auto net = mlp_43();
      Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, stage), "dist_sync");
      train_steps(*net, trainer, 0, 5);
      dist::reset_collective_counters();
      io::save_sharded_checkpoint(dir, *net, trainer, 3);
      CHECK(dist::collective_counters().allgather.calls == 0);  // each rank writes the chunk it keeps
      train_steps(*net, trainer, 5, 10);
      const Values ref_params = params_of(net->collect_params());
      const Values ref_state = state_values(trainer.state_dict());

      for (int q = 0; q < W; ++q)
        CHECK(fs::exists(fs::path(dir) / ("rank-" + std::to_string(q) + "-of-" + std::to_string(W) + ".safetensors")));
      CHECK(fs::exists(fs::path(dir) / "index.json"));
      CHECK(fs::exists(fs::path(dir) / "parameters.safetensors"));

      auto fresh = mlp_43();
      Trainer second(fresh->collect_params(), u.optimizer, at_stage(u.opt, stage), "dist_sync");
      CHECK(io::load_sharded_checkpoint(dir, *fresh, second) == 3);
      CHECK(second.num_update() == 5);
      train_steps(*fresh, second, 5, 10);
      CHECK(params_of(fresh->collect_params()) == ref_params);
      CHECK(state_values(second.state_dict()) == ref_state);
      remove_dir(dir);
    }
}

TEST_CASE("resharding: written at W ranks by ZeRO-2, loaded by a replicated Trainer, the gathered state") {
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const std::string dir = shared_dir("reshard");
    auto net = mlp_43();
    Trainer sharded(net->collect_params(), u.optimizer, at_stage(u.opt, 2), "dist_sync");
    train_steps(*net, sharded, 0, 6);
    io::save_sharded_checkpoint(dir, *net, sharded, 1);
    const Values gathered = state_values(sharded.state_dict());
    const Values params = params_of(net->collect_params());

    // One process's view: the whole state on one device, no communication in its steps.
    auto alone = mlp_43();
    Trainer replicated(alone->collect_params(), u.optimizer, u.opt, "device");
    CHECK(io::load_sharded_checkpoint(dir, *alone, replicated) == 1);
    CHECK(state_values(replicated.state_dict()) == gathered);
    CHECK(params_of(alone->collect_params()) == params);
    // Into one process of N = 1, 2 and 4 devices at ZeRO-2: the same state and parameters on every
    // replica, laid out over its devices at the next step, which continues as the replicated one.
    backward_rows(*alone, 6, 0, kGlobalBatch);
    replicated.step(kGlobalBatch);
    const Values after_step = state_values(replicated.state_dict());
    for (int n : {1, 2, 4}) {
      CAPTURE(n);
      std::vector<Device> devices;
      for (int i = 0; i < n; ++i) devices.push_back(cpu(i));
      auto local = mlp_43();
      local->initialize(Init::Xavier(), devices, /*force_reinit=*/true);
      Trainer over_devices(local->collect_params(), u.optimizer, at_stage(u.opt, 2), "device");
      CHECK(io::load_sharded_checkpoint(dir, *local, over_devices) == 1);
      CHECK(state_values(over_devices.state_dict()) == gathered);
      for (auto& [name, p] : local->collect_params())
        for (auto& w : p->list_data()) CHECK(w.to_vector() == params.at(name));
      step_on_devices([&](const std::vector<Tensor>& xs) { return local->forward_shards(xs); }, over_devices, devices, 6);
      REQUIRE(over_devices.shards() != nullptr);
      CHECK(over_devices.shards()->devices() == devices);
      int64_t state_bytes = 0;
      for (const DeviceMemory& m : over_devices.memory_per_device()) state_bytes += m.state_bytes;
      CHECK(state_bytes == static_cast<int64_t>(4 * over_devices.state_names().size()) * kP);
      const Values continued = state_values(over_devices.state_dict());
      for (auto& [key, v] : after_step)  // the devices add the batch's rows in another order: rounding apart
        for (size_t e = 0; e < v.size(); ++e) CHECK(std::fabs(continued.at(key)[e] - v[e]) <= 1e-5f * (1 + std::fabs(v[e])));
    }

    // And into ZeRO-1 over the same ranks: placed into its chunks at the next step, as the sharded run continues.
    auto again = mlp_43();
    Trainer stage1(again->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
    io::load_sharded_checkpoint(dir, *again, stage1);
    // Saved again before its next step (the loaded state not yet placed in its chunks): the same state.
    const std::string dir2 = shared_dir("reshard2");
    io::save_sharded_checkpoint(dir2, *again, stage1, 1);
    auto alone2 = mlp_43();
    Trainer replicated2(alone2->collect_params(), u.optimizer, u.opt, "device");
    io::load_sharded_checkpoint(dir2, *alone2, replicated2);
    CHECK(state_values(replicated2.state_dict()) == gathered);
    remove_dir(dir2);
    train_steps(*net, sharded, 6, 8);
    train_steps(*again, stage1, 6, 8);
    CHECK(params_of(again->collect_params()) == params_of(net->collect_params()));
    CHECK(state_values(stage1.state_dict()) == state_values(sharded.state_dict()));
    remove_dir(dir);
  }
}

TEST_CASE("bad sharded checkpoints: every rank throws one ConfigError naming the file, nothing changes") {
  const int W = dist::world_size(), r = dist::rank();
  const Setup u = adam_setup();
  const std::string dir = shared_dir("bad"), pristine = shared_dir("pristine"), old_dir = shared_dir("old"),
                    other_dir = shared_dir("other");
  auto net = mlp_43();
  Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
  train_steps(*net, trainer, 0, 3);
  io::save_sharded_checkpoint(old_dir, *net, trainer, 0);  // step 3
  train_steps(*net, trainer, 3, 5);
  io::save_sharded_checkpoint(dir, *net, trainer, 1);  // step 5
  io::save_sharded_checkpoint(other_dir, *net, trainer, 1);  // step 5, another save
  dist::barrier();
  if (r == 0) fs::copy(dir, pristine, fs::copy_options::recursive | fs::copy_options::overwrite_existing);

  // The trainer being loaded into has its own state, which must survive every failed load.
  auto target = mlp_43();
  Trainer victim(target->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
  train_steps(*target, victim, 0, 2);
  const Values state_before = state_values(victim.state_dict());
  const Values params_before = params_of(target->collect_params());

  const std::string last = "rank-" + std::to_string(W - 1) + "-of-" + std::to_string(W) + ".safetensors";
  const fs::path victim_file = fs::path(dir) / last;
  struct Case {
    std::string name, expect;
    std::function<void()> damage;
  };
  const std::vector<Case> cases = {
      {"missing", victim_file.string() + ": missing", [&] { fs::remove(victim_file); }},
      {"truncated", victim_file.string() + ": truncated",
       [&] { fs::resize_file(victim_file, fs::file_size(victim_file) - 10); }},
      {"stale", victim_file.string() + ": stale: step 5 in the index, 3 in the file",
       [&] { fs::copy_file(fs::path(old_dir) / last, victim_file, fs::copy_options::overwrite_existing); }},
      {"another save", victim_file.string() + ": from another run",
       [&] { fs::copy_file(fs::path(other_dir) / last, victim_file, fs::copy_options::overwrite_existing); }},
      {"damaged", victim_file.string() + ": damaged",
       [&] {
         std::fstream f(victim_file, std::ios::in | std::ios::out | std::ios::binary);
         f.seekp(static_cast<std::streamoff>(fs::file_size(victim_file)) - 1);
         f.put('\x7f');
       }},
      {"parameters of another save", (fs::path(dir) / "parameters.safetensors").string() + ": damaged or from another save",
       [&] {
         fs::copy_file(fs::path(old_dir) / "parameters.safetensors", fs::path(dir) / "parameters.safetensors",
                       fs::copy_options::overwrite_existing);
       }},
      {"no index", (fs::path(dir) / "index.json").string() + ": missing", [&] { fs::remove(fs::path(dir) / "index.json"); }},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    dist::barrier();
    if (r == 0) {
      fs::remove_all(dir);
      fs::copy(pristine, dir, fs::copy_options::recursive);
      c.damage();
    }
    dist::barrier();
    std::string message;
    try {
      io::load_sharded_checkpoint(dir, *target, victim);
    } catch (const ConfigError& e) {
      message = e.what();
    }
    CHECK(message.find("checkpoint " + c.expect) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    const auto all = dist::gather_strings(message);
    for (auto& m : all) CHECK(m == message);  // the same line on every rank
    CHECK(state_values(victim.state_dict()) == state_before);
    CHECK(params_of(target->collect_params()) == params_before);
  }

  // A net with other parameters: the index names the counts.
  {
    dist::barrier();
    if (r == 0) {
      fs::remove_all(dir);
      fs::copy(pristine, dir, fs::copy_options::recursive);
    }
    dist::barrier();
    auto bigger = std::make_shared<Sequential>();
    bigger->add(std::make_shared<Dense>(kHidden, "relu", true, kIn), std::make_shared<Dense>(kHidden, "relu", true, kHidden),
                std::make_shared<Dense>(kOut, "", true, kHidden));
    bigger->initialize(Init::Xavier(), {cpu(0)});
    Trainer t(bigger->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
    CHECK_THROWS_WITH_AS(io::load_sharded_checkpoint(dir, *bigger, t),
                         doctest::Contains("index.json: written for 4 parameters, this net has 6"), ConfigError);
  }
  CHECK(io::load_sharded_checkpoint(dir, *target, victim) == 1);  // the pristine copy loads
  CHECK(victim.num_update() == 5);
  CHECK(params_of(target->collect_params()) == params_of(net->collect_params()));
  for (auto& d : {dir, pristine, old_dir, other_dir}) remove_dir(d);
}

TEST_CASE("save_sharded_checkpoint refuses a negative epoch before any collective") {
  auto net = mlp_43();
  Trainer trainer(net->collect_params(), "sgd", {.learning_rate = 0.1f}, "dist_sync");
  CHECK_THROWS_AS(io::save_sharded_checkpoint("/nonexistent/x", *net, trainer, -1), ConfigError);
}

TEST_CASE("ZeRO-3: FSDP's shards saved, loaded into a fresh FSDP they continue bit for bit; loaded at ZeRO-1, the same values") {
  const int W = dist::world_size(), r = dist::rank();
  auto fsdp_steps = [&](FullyShardedDataParallel& f, Trainer& t, int from, int to) {
    for (int s = from; s < to; ++s) {
      backward_rows([&](const Tensor& x) { return f({x})[0]; }, s, kGlobalBatch * r / W, kGlobalBatch * (r + 1) / W);
      t.step(kGlobalBatch);
    }
  };
  // Another net's values, so that what a load leaves is the file's.
  auto other_values = [](Sequential& net) {
    for (auto& p : net.collect_params().trainable()) fill_(p->list_data()[0], 0.5f);
  };
  for (const Setup& u : {Setup{}, adam_setup()}) {
    CAPTURE(u.optimizer);
    const std::string dir = shared_dir("zero3");
    auto net = mlp_43();
    Trainer trainer(net->collect_params(), u.optimizer, at_stage(u.opt, 3), "dist_sync");
    FullyShardedDataParallel fsdp(net, trainer);
    fsdp_steps(fsdp, trainer, 0, 5);
    io::save_sharded_checkpoint(dir, *net, trainer, 2);
    const auto params_at_5 = trainer.shards()->parameters();  // a collective
    const Values state_at_5 = state_values(trainer.state_dict());
    fsdp_steps(fsdp, trainer, 5, 10);
    const auto ref_params = trainer.shards()->parameters();
    const Values ref_state = state_values(trainer.state_dict());

    auto fresh = mlp_43();
    other_values(*fresh);
    Trainer second(fresh->collect_params(), u.optimizer, at_stage(u.opt, 3), "dist_sync");
    FullyShardedDataParallel again(fresh, second);  // sharded first: the load writes into the shards
    CHECK(io::load_sharded_checkpoint(dir, *fresh, second) == 2);
    CHECK(second.shards()->parameters() == params_at_5);
    fsdp_steps(again, second, 5, 10);
    CHECK(second.shards()->parameters() == ref_params);
    CHECK(state_values(second.state_dict()) == ref_state);

    // Resharded: ZeRO-1, the parameters whole on every rank.
    auto plain = mlp_43();
    other_values(*plain);
    Trainer stage1(plain->collect_params(), u.optimizer, at_stage(u.opt, 1), "dist_sync");
    CHECK(io::load_sharded_checkpoint(dir, *plain, stage1) == 2);
    Values expected;
    for (auto& [name, p] : plain->collect_params()) expected[name] = params_at_5[static_cast<size_t>(stage1.index_of(*p))];
    CHECK(params_of(plain->collect_params()) == expected);
    CHECK(state_values(stage1.state_dict()) == state_at_5);
    remove_dir(dir);
  }
}

TEST_CASE("ZeRO-3 over the devices of one process: saved, loaded into a fresh FSDP's shards, it continues bit for bit") {
  if (dist::world_size() > 1) return;  // one process's devices (P = 43 over 3: parameters straddle the shards)
  const std::vector<Device> devices{cpu(0), cpu(1), cpu(2)};
  auto make = [&](bool other_values) {
    auto net = std::make_shared<Sequential>();
    net->add(std::make_shared<Dense>(kHidden, "relu", true, kIn), std::make_shared<Dense>(kOut, "", true, kHidden));
    manual_seed(42);
    net->initialize(Init::Xavier(), devices);
    if (other_values)
      for (auto& p : net->collect_params().trainable())
        for (auto& w : p->list_data()) fill_(w, 0.5f);
    return net;
  };
  auto steps = [&](FullyShardedDataParallel& f, Trainer& t, int from, int to) {
    for (int s = from; s < to; ++s) step_on_devices([&](const std::vector<Tensor>& xs) { return f(xs); }, t, devices, s);
  };
  const OptimizerOptions o = at_stage(adam_setup().opt, 3);
  const std::string dir = shared_dir("zero3_devices");
  auto net = make(false);
  Trainer trainer(net->collect_params(), "adam", o, "device");
  FullyShardedDataParallel fsdp(net, trainer);
  steps(fsdp, trainer, 0, 4);
  io::save_sharded_checkpoint(dir, *net, trainer, 1);
  const auto params_at_4 = trainer.shards()->parameters();
  steps(fsdp, trainer, 4, 8);
  const auto ref_params = trainer.shards()->parameters();
  const Values ref_state = state_values(trainer.state_dict());

  auto fresh = make(true);
  Trainer second(fresh->collect_params(), "adam", o, "device");
  FullyShardedDataParallel again(fresh, second);
  CHECK(io::load_sharded_checkpoint(dir, *fresh, second) == 1);
  CHECK(second.shards()->parameters() == params_at_4);
  steps(again, second, 4, 8);
  CHECK(second.shards()->parameters() == ref_params);
  CHECK(state_values(second.state_dict()) == ref_state);
  remove_dir(dir);
}

// Resuming in another run at another number of ranks (tests/dist/resume_runs.sh): with
// D2L_SHARDED_RESUME=save:DIR the run takes 5 Adam steps at ZeRO-2 and saves into DIR; with
// resume:DIR a new run, of whatever size, takes 10 steps straight at ZeRO-1 as its reference, then
// a fresh net and Trainer load DIR and take steps 5 to 10: the same parameters and state within
// rounding (W ranks add a global batch's rows in another order than W' do). Without the variable
// these cases do nothing.
namespace {

std::string resume_dir(const char* mode) {
  const char* v = std::getenv("D2L_SHARDED_RESUME");
  const std::string s = v ? v : "", prefix = std::string(mode) + ":";
  return s.rfind(prefix, 0) == 0 ? s.substr(prefix.size()) : "";
}

// mlp_43 and adam_setup's optimizer over the ranks (dist_sync) at ZeRO stage `stage`, after steps
// [0, steps) (none: a fresh net and trainer).
struct AdamOverRanks {
  const Setup u = adam_setup();
  std::shared_ptr<Sequential> net = mlp_43();
  Trainer trainer;
  AdamOverRanks(int stage, int steps)
      : trainer(net->collect_params(), u.optimizer, at_stage(u.opt, stage), "dist_sync") {
    train_steps(*net, trainer, 0, steps);
  }
};

}  // namespace

TEST_CASE("separate runs: save at ZeRO-2 after 5 steps (D2L_SHARDED_RESUME=save:DIR)") {
  const std::string dir = resume_dir("save");
  if (dir.empty()) return;
  AdamOverRanks run(2, 5);
  io::save_sharded_checkpoint(dir, *run.net, run.trainer, 1);
  MESSAGE("saved 5 steps at ZeRO-2 over " << dist::world_size() << " ranks into " << dir);
}

TEST_CASE("separate runs: resume at any number of ranks and continue as 10 steps straight (D2L_SHARDED_RESUME=resume:DIR)") {
  const std::string dir = resume_dir("resume");
  if (dir.empty()) return;
  AdamOverRanks straight(1, 10), resumed(1, 0);
  CHECK(io::load_sharded_checkpoint(dir, *resumed.net, resumed.trainer) == 1);
  CHECK(resumed.trainer.num_update() == 5);
  train_steps(*resumed.net, resumed.trainer, 5, 10);
  const Values want = params_of(straight.net->collect_params()), got = params_of(resumed.net->collect_params());
  for (auto& [name, v] : want) CHECK(test::close(v, got.at(name), 1e-7, 1e-5, name.c_str()));
  const Values want_state = state_values(straight.trainer.state_dict()),
               got_state = state_values(resumed.trainer.state_dict());
  for (auto& [key, v] : want_state) CHECK(test::close(v, got_state.at(key), 1e-7, 1e-4, key.c_str()));
  MESSAGE("resumed over " << dist::world_size() << " ranks from " << dir);
}
