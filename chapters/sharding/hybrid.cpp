// Part 1 over processes with several devices each (mpirun, --num-gpus k > 1): FSDP's two hybrid
// layouts of ZeRO-1 and ZeRO-2, W ranks x k devices, beside the replicated run over the same W k
// devices. Every device takes one of the W k parts of each minibatch (rank r's device i: part r k + i,
// the book's split_and_load over the ranks' devices in rank order) and the same Adam training as the
// rest of part 1 runs five times from the same initial parameters:
//   replicated       kvstore dist_sync at zero_stage 0: every device keeps the whole state, 8 Psi;
//   over the ranks   zero_stage 1 and 2 (the default): the shards are the ranks, and a process's k
//                    devices are replicas of each other (core/optim/zero.hpp). Their gradients
//                    are summed on the first device before the reduce-scatter; rank r's chunk of the
//                    state (8 Psi_r, Psi_r of the W-way split) and, at stage 2, of the summed gradient
//                    (4 Psi_r) live on that first device, none on the others;
//   every device     zero_stage 1 and 2 with ShardOver::all_devices: every device of every rank its own
//                    shard, W k of them: device i of rank r keeps the state of shard r k + i (8 Psi_rk+i);
//                    the rank's shards together are its chunk of the W-way split (the rule nests); each
//                    device sums its share over the process's devices, then reduce-scatters it over the
//                    ranks (and all-gathers the other way); at stage 2 each device keeps its own
//                    shard's sum (4 Psi_rk+i) and updates its piece;
//   over the devices zero_stage 1, 2 and 3 with ShardOver::devices (FSDP's HYBRID_SHARD): the shards are
//                    each process's devices, replicated over the ranks (core/optim/zero.hpp): device i
//                    of every rank keeps shard i (8 Psi_i of state, Psi_i of the k-way split; at
//                    stage 3 the parameters' shard too, the net run through FullyShardedDataParallel,
//                    a unit gathered over the process's devices only), its pieces of the sum
//                    all-reduced over the ranks before the update: sharded inside a machine,
//                    replicated across machines, where the links are slow.
// What each device holds is measured from its allocator's tags, as in the rest of part 1, and every
// run's parameters, on every device of every rank, are compared with the replicated run's. (ZeRO-3
// over the ranks or every device, with several devices a rank, adds each device's sum over the ranks
// first: its last bits differ, and Adam's steps then drift; the README says why. They are left out.)
#include <algorithm>
#include <cmath>
#include <optional>
#include <sstream>

#include "chapters/sharding/report.hpp"
#include "chapters/sharding/sharding.hpp"
#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/comm.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/sequential.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::sharding {

namespace {

// Every replica of every trainable parameter, this rank's devices in order, end to end.
std::vector<float> all_replicas(const nn::Block& net) {
  std::vector<float> out;
  for (auto& p : net.collect_params().trainable())
    for (auto& w : p->list_data()) {
      const std::vector<float> v = w.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
  return out;
}


}  // namespace

const char* hybrid_layout_name(HybridLayout l) {
  return l == HybridLayout::replicated   ? "replicated"
         : l == HybridLayout::over_ranks ? "over ranks"
         : l == HybridLayout::over_all   ? "every device"
                                         : "over devices";
}

HybridResult hybrid_over_ranks(const Config& cfg) {
  const int W = dist::world_size(), me = dist::rank(), k = static_cast<int>(cfg.devices.size());
  const std::vector<Device>& devices = cfg.devices;
  DataIter train_iter(*cfg.train_data, cfg.batch_size, true, cfg.seed);  // the same minibatches on every rank
  const Shape feature_shape = train_iter.data().feature_shape;
  int64_t features = 1;
  for (int64_t s : feature_shape) features *= s;
  HybridResult out;
  out.ranks = W, out.devices = k;
  std::vector<float> replicated;  // the replicated run's parameters, every device's replicas
  std::vector<std::pair<HybridLayout, int>> runs{{HybridLayout::replicated, 0}};
  for (int stage = 1; stage <= std::min(cfg.zero_stage, 2); ++stage)
    for (HybridLayout l : {HybridLayout::over_ranks, HybridLayout::over_all, HybridLayout::over_devices}) runs.push_back({l, stage});
  if (cfg.zero_stage >= 3) runs.push_back({HybridLayout::over_devices, 3});
  for (auto [layout, stage] : runs) {
    manual_seed(cfg.seed);
    std::vector<MemoryStats> before;  // what the devices held before this run (its bytes are the difference)
    for (const Device& d : devices) before.push_back(runtime(d).allocator->stats());
    auto net = zero_mlp(features, cfg);
    net->initialize(Init::Xavier(), devices, /*force_reinit=*/true);
    optim::OptimizerOptions o{.learning_rate = cfg.adam_lr, .clip_grad_norm = cfg.clip_grad_norm, .zero_stage = stage,
                              .reduce_bucket_mb = cfg.reduce_bucket_mb};
    o.shard_over = layout == HybridLayout::over_devices ? optim::ShardOver::devices
                   : layout == HybridLayout::over_all ? optim::ShardOver::all_devices
                                                      : optim::ShardOver::ranks;
    HybridRun run;
    run.layout = layout, run.stage = stage;
    std::vector<float> values;  // every device's replicas after the run
    {
      optim::Trainer trainer(net->collect_params(), "adam", o, "dist_sync");
      optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
      // Stage 3: FSDP(net) in place of net; the parameters become each process's devices' shards here.
      std::unique_ptr<optim::FullyShardedDataParallel> fsdp;
      if (stage == 3) fsdp = std::make_unique<optim::FullyShardedDataParallel>(net, trainer);
      load_run(cfg, *net, trainer);  // --load: the checkpoint in place of the seed's parameters
      int step = 0;
      for (int64_t epoch = 0; step <= cfg.steps; ++epoch) {
        for (const Batch& b : train_iter.epoch(epoch)) {
          if (step > cfg.steps) break;
          check_interrupt();
          if (step == 1) {
            waitall();
            for (const Device& d : devices) runtime(d).allocator->reset_peak();
          }
          // ls = [loss(net(X_q), y_q) for the parts q = r k + i of this rank's devices]; l.backward() each
          std::vector<Tensor> Xs, ys, ls;
          for (int i = 0; i < k; ++i) {
            const int64_t q = int64_t(me) * k + i, lo = b.n * q / (int64_t(W) * k), hi = b.n * (q + 1) / (int64_t(W) * k);
            Shape xs{hi - lo};
            xs.insert(xs.end(), feature_shape.begin(), feature_shape.end());
            Xs.push_back(Tensor::from_vector(std::vector<float>(b.X.begin() + lo * features, b.X.begin() + hi * features), xs, devices[i]));
            ys.push_back(Tensor::from_vector(std::vector<int32_t>(b.y.begin() + lo, b.y.begin() + hi), {hi - lo}, devices[i]));
          }
          {
            Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
            const std::vector<Tensor> outs = fsdp ? (*fsdp)(Xs) : (*net)(Xs);
            for (int i = 0; i < k; ++i) ls.push_back(softmax_cross_entropy(outs[size_t(i)], ys[size_t(i)], Reduction::sum));
            for (auto& l : ls) scaler.scale(l).backward();
          }
          // trainer.step: the gradient summed over every device of every rank: the whole minibatch's
          const bool stepped = scaler.step(trainer, b.n);
          scaler.update();
          double loss = 0;
          for (auto& l : ls) loss += l.item();
          loss = dist::sum_over_ranks({loss})[0];
          check_loss(loss, stepped, 1, step + 1);
          ++step;
        }
      }
      waitall();
      out.psi = 0;
      for (auto& p : net->collect_params().trainable()) out.psi += p->list_data()[0].numel();
      // Measured: every device's bytes by tag now, between steps, then every rank's rows.
      std::vector<double> mine;
      for (size_t i = 0; i < devices.size(); ++i) {
        const MemoryStats now = runtime(devices[i]).allocator->stats();
        auto held = [&](MemoryTag t) { return double(now.held(t) - before[i].held(t)); };
        for (double f : {held(MemoryTag::parameters), held(MemoryTag::gradients), held(MemoryTag::summed_gradients),
                         held(MemoryTag::optimizer_state), held(MemoryTag::gathered), double(now.peak),
                         double(now.at_peak[static_cast<int>(MemoryTag::other)])})
          mine.push_back(f);
      }
      {  // after the bytes are read: the replicas made whole here are not training's
        std::optional<optim::FullyShardedDataParallel::FullParameters> full;  // summon_full_params:
        if (fsdp) full.emplace(*fsdp);                                         // every replica whole while read
        values = all_replicas(*net);
      }
      const std::vector<double> all = from_every_rank(mine);
      constexpr size_t kFigures = 7;
      for (int r = 0; r < W; ++r)
        for (int i = 0; i < k; ++i) {
          const double* f = &all[(size_t(r) * k + i) * kFigures];
          // The shard this device holds: rank r's chunk on its first device (over the ranks), shard i
          // on device i of every rank (over the devices), nothing when replicated.
          // Every device: shard r k + i of W k, for the state and the sum.
          int64_t shard = 0;
          if (layout == HybridLayout::over_ranks && i == 0) shard = part_of(out.psi, r, W);
          if (layout == HybridLayout::over_devices) shard = stage == 3 ? unit_shard(*net, i, k) : part_of(out.psi, i, k);
          if (layout == HybridLayout::over_all) shard = part_of(out.psi, r * k + i, W * k);
          MemoryRow row{W * k, stage, devices[i]};
          row.parameter_bytes = int64_t(f[0]), row.gradient_bytes = int64_t(f[1]);
          row.summed_gradient_bytes = int64_t(f[2]), row.state_bytes = int64_t(f[3]), row.gathered_bytes = int64_t(f[4]);
          row.peak_bytes = int64_t(f[5]), row.peak_by_tag[static_cast<int>(MemoryTag::other)] = int64_t(f[6]);
          row.formula_parameter_bytes = 4 * (stage == 3 ? shard : out.psi);
          row.formula_gradient_bytes = stage >= 2 ? 0 : 4 * out.psi;
          row.formula_summed_gradient_bytes = stage >= 2 ? 4 * shard : 0;
          row.formula_state_bytes = 8 * (stage == 0 ? out.psi : shard);
          run.rows.push_back(row);
        }
    }
    // Every device's replicas against the replicated run's, and against rank 0's (broadcast).
    if (layout == HybridLayout::replicated) replicated = values;
    Tensor rank0 = Tensor::from_vector(values, {static_cast<int64_t>(values.size())}, cpu(0));
    dist::broadcast(rank0, 0);
    const std::vector<double> diffs = from_every_rank({largest_difference(values, replicated), largest_difference(values, rank0.to_vector())});
    for (int r = 0; r < W; ++r)
      run.max_diff_to_replicated = std::max(run.max_diff_to_replicated, diffs[2 * size_t(r)]),
      run.max_diff_to_rank0 = std::max(run.max_diff_to_rank0, diffs[2 * size_t(r) + 1]);
    out.runs.push_back(run);
  }
  return out;
}

int print_hybrid(const Config& cfg, const HybridResult& h) {
  const double rtol = rounding_tolerance(cfg.autocast);  // "equal within rounding"
  std::printf("\n1b. Hybrid sharding over %d processes x %d devices: ZeRO-1 and ZeRO-2 with the shards over the ranks "
              "(each process's devices replicas of each other), over every device of every rank, and over each "
              "process's devices (replicated over the ranks, FSDP's HYBRID_SHARD, also at ZeRO-3), against replicated "
              "Adam on the same %d devices\n"
              "Psi = %lld, batch %lld split over the %d devices, %d timed steps\n",
              h.ranks, h.devices, h.ranks * h.devices, (long long)h.psi, (long long)cfg.batch_size, h.ranks * h.devices,
              cfg.steps);
  std::printf("%-12s %2s %5s %-10s %10s %-9s %10s %10s %-6s %10s %10s %-9s %10s %10s %-9s %10s %8s %10s %10s\n", "shards",
              "N", "stage", "rank:dev", "params B", "formula", "= B", ".grad B", "formula", "= B", "sum B", "formula", "= B",
              "state B", "formula", "= B", "gather B", "peak B", "act@peak");
  int failed = 0;
  for (const HybridRun& run : h.runs)
    for (size_t j = 0; j < run.rows.size(); ++j) {
      const MemoryRow& m = run.rows[j];
      const int r = static_cast<int>(j) / h.devices, i = static_cast<int>(j) % h.devices;
      std::ostringstream where;
      where << r << ":" << m.device;
      const std::string chunk = i == 0 ? "Psi_r" + std::to_string(r) : "0";
      const std::string shard = run.layout == HybridLayout::over_devices ? (run.stage == 3 ? "Psi'_" : "Psi_") + std::to_string(i)
                                : run.layout == HybridLayout::over_all   ? "Psi_" + std::to_string(r * h.devices + i)
                                : run.layout == HybridLayout::over_ranks ? chunk
                                                                         : "0";
      std::printf("%-12s ", hybrid_layout_name(run.layout));
      print_memory_row(m, where.str(), shard, 10, 9);
      std::printf("\n");
      if (m.parameter_bytes != m.formula_parameter_bytes || m.gradient_bytes != m.formula_gradient_bytes ||
          m.summed_gradient_bytes != m.formula_summed_gradient_bytes || m.state_bytes != m.formula_state_bytes ||
          m.gathered_bytes != 0) {
        std::printf("memory check, %s, stage %d, rank %d, device %d: the bytes held differ from the model\n",
                    hybrid_layout_name(run.layout), run.stage, r, i);
        ++failed;
      }
    }
  std::printf("(Measured after the last step, by tag, on every device of every rank. Over the ranks: Psi_rR = rank R's "
              "chunk of the %d-way split, on its first device; the others hold replicas only (8*0). Every device: "
              "Psi_g = shard g = R k + i of the %d-way split on device i of rank R, its state and sum. Over the "
              "devices: Psi_i = shard i of the %d-way split, the same on every rank (at stage 3 Psi'_i, shard i of "
              "each layer's split, added up). Sums of "
              "the W k devices' gradients: at stage 1 they live during the step only)\n",
              h.ranks, h.ranks * h.devices, h.devices);
  // The peaks: over the ranks a process's first device carries the chunk's state, its sum and the
  // devices' summed gradient, its other devices none of it; over the devices every device a shard.
  int64_t replicated_peak = 0;
  std::printf("largest peak per device (B):");
  for (const HybridRun& run : h.runs) {
    int64_t top = 0;
    for (const MemoryRow& m : run.rows) top = std::max(top, m.peak_bytes);
    if (run.layout == HybridLayout::replicated) replicated_peak = top;
    std::printf("%s %s%s %lld (%.2fx)", run.layout == HybridLayout::replicated ? "" : ",", hybrid_layout_name(run.layout),
                run.stage ? (" ZeRO-" + std::to_string(run.stage)).c_str() : "", (long long)top,
                replicated_peak ? double(top) / double(replicated_peak) : 0.0);
  }
  std::printf("\n");
  for (const HybridRun& run : h.runs) {
    if (run.layout == HybridLayout::replicated) continue;
    const double d = run.max_diff_to_replicated;
    const bool ok = d <= rtol && run.max_diff_to_rank0 == 0;
    std::printf("hybrid check, ZeRO-%d, shards %s: every device's parameters on every rank %s the replicated "
                "run's (largest difference %g) and %s rank 0's\n",
                run.stage, hybrid_layout_name(run.layout), d == 0 ? "equal" : d <= rtol ? "equal within rounding" : "DIFFER from",
                d, run.max_diff_to_rank0 == 0 ? "are the same bits as" : "DIFFER from");
    if (!ok) ++failed;
  }
  return failed;
}

}  // namespace d2l::sharding
