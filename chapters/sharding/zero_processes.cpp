// Part 1 over processes: under mpirun with W > 1 ranks, ZeRO-1, ZeRO-2 and ZeRO-3 shard over the
// ranks, one device each, the paper's own setting (Rajbhandari et al., SC20: each data-parallel
// process keeps 1/N_d of the optimizer state, section 5.1, of the summed gradients, section 5.2, and
// of the parameters, section 5.3). The same Adam training as zero_memory.cpp, four times from the
// same initial parameters over the same minibatches, each rank taking its rows of every minibatch:
//   stage 0  kvstore dist_sync: every gradient all-reduced over the ranks, every rank keeps m and v
//            for all Psi elements and updates them all (8 Psi bytes of state on every rank);
//   stage 1  a reduce-scatter at the step instead of the allreduce (MPI_Reduce_scatter, bucket by
//            bucket): rank r receives chunk r's summed gradient only (Psi_r elements,
//            dist::chunk_begin's split), keeps m and v of chunk r (8 Psi_r), updates it, and
//            dist::allgather gives every rank the whole update; the .grad buffers stay (4 Psi);
//   stage 2  the same reduce-scatter during backward, in buckets of reduce_bucket_mb (the Trainer's default 25 MiB, --reduce-bucket-mb): each
//            goes once backward has completed its gradients, whose .grad buffers are then released:
//            rank r keeps chunk r's summed gradient (4 Psi_r) and no .grad buffer between steps;
//   stage 3  FSDP (core/optim/zero.hpp): each layer's parameters are a flat vector of Psi_u
//            elements and rank r keeps its chunk of each, Psi'_r elements over the layers: 4 Psi'_r
//            of parameters, 4 Psi'_r of summed gradient and 8 Psi'_r of state, no .grad buffers
//            between steps; a layer is all-gathered before its forward and its backward and its
//            gradients reduce-scattered once complete.
// Rank 0 prints every rank's row (the figures gathered with dist::sum_over_ranks), the bytes each rank
// sent a step as dist::collective_counters counts them (a reduce-scatter of n elements sends n - c_r,
// an all-gather c_r (W-1), an allreduce both) beside the paper's (W-1)/W * 2 * 4 Psi at stages 0 to 2
// (a reduce-scatter and an all-gather, or an allreduce) and (W-1)/W * 3 * 4 Psi at stage 3, and a
// check line per sharded run: every rank's parameters against its replicated run's, and against rank 0's.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <sstream>

#include "chapters/harness/harness.hpp"
#include "chapters/sharding/report.hpp"
#include "chapters/sharding/sharding.hpp"
#include "core/allocator.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/sequential.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/trace.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::sharding {

namespace {

// The trainable parameters end to end, as the Trainer lays them out.
std::vector<float> flat_parameters(const nn::Block& net) {
  std::vector<float> out;
  for (auto& p : net.collect_params().trainable()) {
    const std::vector<float> v = p->list_data()[0].to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}


// The bytes each rank sent a step (dist::collective_counters), the largest over the ranks and their
// total, beside the paper's: per rank (W-1)/W * k * 4 Psi, k = 2 at stages 0 to 2 and 3 at stage 3
// (with Psi'_r's per-layer chunks; the total k (W-1) 4 Psi is exact whenever the chunks add up).
// Returns the stages whose total differs from the formula's.
int print_sent_bytes(const ZeroResult& r) {
  std::printf("bytes sent a step per rank, counted by dist::collective_counters (the ring's rule: a reduce-scatter of n "
              "elements sends n - Psi_r, an all-gather Psi_r (N-1), an allreduce both):\n");
  std::printf("%2s %5s %12s %12s %-18s %12s %12s %-16s %12s\n", "N", "stage", "max rank B", "mean B", "formula",
              "= B", "total B", "formula", "= B");
  int failed = 0;
  for (const auto& run : r.runs) {
    const int k = run.stage == 3 ? 3 : 2, W = run.n;
    int64_t most = 0;
    for (const MemoryRow& m : run.rows) most = std::max(most, m.sent_bytes);
    const double per_rank = double(W - 1) / W * k * 4.0 * double(r.psi);
    const int64_t total = run.formula_sent_bytes;  // k (W-1) 4 Psi, less the all-gathers of skipped steps
    const std::string rank_formula = "(N-1)/N*" + std::to_string(k) + "*4*Psi", total_formula = std::to_string(k) + "*(N-1)*4*Psi";
    std::printf("%2d %5d %12lld %12.1f %-18s %12.1f %12lld %-16s %12lld%s\n", W, run.stage, (long long)most,
                double(run.sent_bytes) / W, rank_formula.c_str(), per_rank, (long long)run.sent_bytes, total_formula.c_str(),
                (long long)total, run.sent_bytes == total ? "" : " (DIFFERENT)");
    if (run.skipped > 0)
      std::printf("   (%lld steps skipped by the loss scaler%s)\n", (long long)run.skipped,
                  run.stage == 1 || run.stage == 2 ? ", without their all-gather: counted so in the formula" : "");
    if (run.sent_bytes != total) ++failed;
  }
  return failed;
}

}  // namespace

double largest_difference(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(double(a[i]) - double(b[i])));
  return d;
}

std::vector<double> from_every_rank(const std::vector<double>& mine) {
  const size_t n = mine.size(), r = static_cast<size_t>(dist::rank());
  std::vector<double> all(n * static_cast<size_t>(dist::world_size()), 0.0);
  std::copy(mine.begin(), mine.end(), all.begin() + static_cast<std::ptrdiff_t>(r * n));
  return dist::sum_over_ranks(all);
}

ZeroRanksResult zero_memory_over_ranks(const Config& cfg) {
  const int W = dist::world_size(), me = dist::rank();
  const Device device = cfg.devices[0];  // one device a rank: the shards are the ranks
  DataIter train_iter(*cfg.train_data, cfg.batch_size, true, cfg.seed);  // the same minibatches on every rank
  Shape feature_shape = train_iter.data().feature_shape;
  int64_t features = 1;
  for (int64_t s : feature_shape) features *= s;
  ZeroRanksResult out;
  ZeroResult& result = out.zero;
  std::vector<float> replicated;  // stage 0's parameters after its steps, on this rank
  for (int stage = 0; stage <= cfg.zero_stage; ++stage) {
    manual_seed(cfg.seed);
    const MemoryStats before = runtime(device).allocator->stats();  // this run's bytes are the difference
    auto net = zero_mlp(features, cfg);
    net->initialize(Init::Xavier(), {device}, /*force_reinit=*/true);
    optim::Trainer trainer(net->collect_params(), "adam", {.learning_rate = cfg.adam_lr, .clip_grad_norm = cfg.clip_grad_norm, .zero_stage = stage, .reduce_bucket_mb = cfg.reduce_bucket_mb}, "dist_sync");
    optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
    // Stage 3: the parameters become this rank's chunks here, and the net runs through FSDP.
    std::unique_ptr<optim::FullyShardedDataParallel> fsdp;
    if (stage == 3) fsdp = std::make_unique<optim::FullyShardedDataParallel>(net, trainer);
    load_run(cfg, *net, trainer);  // --load: the checkpoint in place of the seed's parameters
    // --trace: the last timed step of the last stage run, every rank's streams and communication
    // thread in one timeline (each rank's clock starts right after the same barrier).
    const bool trace_this = !cfg.trace_file.empty() && stage == cfg.zero_stage;
    ZeroRun run;
    run.n = W, run.stage = stage;
    auto start = std::chrono::steady_clock::now();
    waitall();
    dist::reset_collective_counters();  // from here, the training steps' collectives only
    int step = 0;
    double last_loss = 0;
    int64_t last_n = 1;
    for (int64_t epoch = 0; step <= cfg.steps; ++epoch) {
      for (const Batch& b : train_iter.epoch(epoch)) {
        if (step > cfg.steps) break;
        check_interrupt();
        if (step == 1) waitall(), runtime(device).allocator->reset_peak(), start = std::chrono::steady_clock::now();
        const bool tracing = trace_this && step == cfg.steps;
        if (tracing) waitall(), dist::barrier(), trace::start();
        // Rank r's rows of the minibatch: [n r / W, n (r + 1) / W).
        const int64_t lo = b.n * me / W, hi = b.n * (me + 1) / W;
        Shape xs{hi - lo};
        xs.insert(xs.end(), feature_shape.begin(), feature_shape.end());
        Tensor X = Tensor::from_vector(std::vector<float>(b.X.begin() + lo * features, b.X.begin() + hi * features), xs, device);
        Tensor y = Tensor::from_vector(std::vector<int32_t>(b.y.begin() + lo, b.y.begin() + hi), {hi - lo}, device);
        Tensor l;
        {
          Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
          l = softmax_cross_entropy(fsdp ? (*fsdp)({X})[0] : (*net)(X), y, Reduction::sum);
          scaler.scale(l).backward();
        }
        const bool stepped = scaler.step(trainer, b.n);  // the gradient summed over the ranks is that of the whole minibatch
        scaler.update();
        if (tracing) {
          waitall();
          trace::stop();
          run.trace_tasks = static_cast<int64_t>(dist::sum_over_ranks({double(trace::events().size())})[0]);
          harness::write_timeline(cfg.trace_file, trace::events());
        }
        last_loss = l.item();
        check_loss(last_loss, stepped, 1, step + 1);
        last_n = b.n;
        if (!stepped) ++run.skipped;  // the same steps on every rank (found_inf is summed over them)
        ++step;
      }
    }
    waitall();
    const int64_t sent = dist::collective_counters().sent_bytes();  // over every step, the warm-up's too
    run.seconds_per_step = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / cfg.steps;
    run.final_loss = dist::sum_over_ranks({last_loss})[0] / static_cast<double>(last_n);
    result.psi = 0;
    for (auto& p : net->collect_params().trainable()) result.psi += p->list_data()[0].numel();
    // This rank's bytes by tag, measured from its device's allocator, then every rank's.
    const MemoryStats now = runtime(device).allocator->stats();
    auto held = [&](MemoryTag t) { return double(now.held(t) - before.held(t)); };
    const std::vector<double> all = from_every_rank(
        {held(MemoryTag::parameters), held(MemoryTag::gradients), held(MemoryTag::summed_gradients),
         held(MemoryTag::optimizer_state), held(MemoryTag::gathered), double(now.peak),
         double(now.at_peak[static_cast<int>(MemoryTag::other)]), double(sent)});
    constexpr size_t kFigures = 8;
    for (int r = 0; r < W; ++r) {
      const double* f = &all[static_cast<size_t>(r) * kFigures];
      const int64_t chunk = stage == 3 ? unit_shard(*net, r, W) : part_of(result.psi, r, W);
      MemoryRow row{W, stage, device};
      row.parameter_bytes = int64_t(f[0]), row.gradient_bytes = int64_t(f[1]);
      row.summed_gradient_bytes = int64_t(f[2]), row.state_bytes = int64_t(f[3]), row.gathered_bytes = int64_t(f[4]);
      row.peak_bytes = int64_t(f[5]);
      row.peak_by_tag[static_cast<int>(MemoryTag::other)] = int64_t(f[6]);
      row.formula_parameter_bytes = 4 * (stage == 3 ? chunk : result.psi);
      row.formula_gradient_bytes = stage >= 2 ? 0 : 4 * result.psi;
      row.formula_state_bytes = 8 * (stage == 0 ? result.psi : chunk);
      row.formula_summed_gradient_bytes = stage >= 2 ? 4 * chunk : 0;
      row.sent_bytes = int64_t(f[7]) / step;
      run.sent_bytes += int64_t(f[7]);
      run.rows.push_back(row);
    }
    // All ranks a step: k (W-1) 4 Psi (k = 2 at stages 0 to 2, 3 at stage 3); a step the GradScaler
    // skipped (fp16) reduces but gathers nothing at stages 1 and 2: (W-1) 4 Psi.
    const int64_t k = stage == 3 ? 3 : 2, k_skipped = stage == 1 || stage == 2 ? 1 : k;
    run.formula_sent_bytes = (k * (step - run.skipped) + k_skipped * run.skipped) * (W - 1) * 4 * result.psi / step;
    run.sent_bytes /= step;
    // Every rank's parameters against its replicated run's, and against rank 0's (broadcast). At
    // stage 3 they are whole only while gathered (every rank gathers: a collective).
    std::vector<float> mine;
    if (fsdp) {
      optim::FullyShardedDataParallel::FullParameters whole(*fsdp);
      mine = flat_parameters(*net);
    } else {
      mine = flat_parameters(*net);
    }
    if (stage == 0) replicated = mine;
    Tensor rank0 = Tensor::from_vector(mine, {static_cast<int64_t>(mine.size())}, cpu(0));
    dist::broadcast(rank0, 0);
    const std::vector<double> diffs =
        from_every_rank({stage == 0 ? 0.0 : largest_difference(mine, replicated), largest_difference(mine, rank0.to_vector())});
    double to_replicated = 0, to_rank0 = 0;
    for (int r = 0; r < W; ++r)
      to_replicated = std::max(to_replicated, diffs[2 * static_cast<size_t>(r)]),
      to_rank0 = std::max(to_rank0, diffs[2 * static_cast<size_t>(r) + 1]);
    if (stage > 0) run.max_diff_to_replicated = to_replicated;
    if (stage == cfg.zero_stage) save_run(cfg, *net, trainer, run);  // --save: the last run, once measured
    result.runs.push_back(run);
    out.diff_to_rank0.push_back(to_rank0);
  }
  return out;
}

int print_zero_over_ranks(const Config& cfg, const ZeroRanksResult& ranks) {
  const double rtol = rounding_tolerance(cfg.autocast);  // "equal within rounding"
  const ZeroResult& r = ranks.zero;
  const int W = r.runs.empty() ? 1 : r.runs[0].n;
  std::printf("\n1. Memory per rank over %d processes, one device each: replicated Adam (kvstore dist_sync, zero_stage 0) "
              "vs ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP) over the ranks (zero_stage 1, 2, 3)\n"
              "MLP 784 -> %lld (x %d layers of equal width) -> 10, Psi = %lld trainable float32 elements, Adam (K = 8 bytes "
              "of state an element), batch %lld split over the ranks, %d timed steps\n",
              W, (long long)cfg.zero_hidden, cfg.zero_layers, (long long)r.psi, (long long)cfg.batch_size, cfg.steps);
  std::printf("%2s %5s %-10s %10s %-9s %10s %10s %-6s %10s %10s %-9s %10s %10s %-9s %10s %8s %10s %10s %10s\n", "N",
              "stage", "rank", "params B", "formula", "= B", ".grad B", "formula", "= B", "sum B", "formula", "= B",
              "state B", "formula", "= B", "gather B", "peak B", "act@peak", "ms/step");
  int failed = 0;
  for (const auto& run : r.runs)
    for (size_t i = 0; i < run.rows.size(); ++i) {
      const MemoryRow& m = run.rows[i];
      std::ostringstream where;
      where << i << ":" << m.device;
      print_memory_row(m, where.str(), (m.stage == 3 ? "Psi'_" : "Psi_") + std::to_string(i), 10, 9);
      if (i == 0) std::printf(" %10.2f", 1e3 * run.seconds_per_step);
      std::printf("\n");
      if (m.parameter_bytes != m.formula_parameter_bytes || m.gradient_bytes != m.formula_gradient_bytes ||
          m.summed_gradient_bytes != m.formula_summed_gradient_bytes || m.state_bytes != m.formula_state_bytes ||
          m.gathered_bytes != 0) {
        std::printf("memory check, stage %d, rank %zu: the bytes held differ from the paper's model\n", m.stage, i);
        ++failed;
      }
    }
  std::printf("(Measured after the last step from the buffers each rank's allocator handed out, by what they hold. Rank "
              "r's chunk: Psi_r = floor(Psi (r+1) / N) - floor(Psi r / N) elements, dist::chunk_begin's split. .grad: "
              "4 Psi at stages 0 and 1, none at stage 2 (each released once its bucket is reduce-scattered) and 3. sum: "
              "chunk r's summed gradient kept apart from them, at stages 2 and 3 (at stage 1 it lives only during the "
              "step). At stage 3 each layer u is a flat vector of Psi_u elements split by the same rule, and Psi'_r = "
              "the sum over the layers of rank r's chunk. peak: the most bytes in use at once during the timed steps; "
              "act@peak: of which activations and temporaries. ms/step: rank 0's)\n");
  print_ladder(r);
  print_saved(cfg, r);
  failed += print_sent_bytes(r);
  // The reduce-scatters of stages 1 to 3 may add the ranks in another order than the allreduce (from 3
  // ranks on): equal within float32 rounding; on 2 ranks the same bits.
  for (size_t k = 0; k < r.runs.size(); ++k) {
    const ZeroRun& run = r.runs[k];
    if (run.stage == 0) continue;
    const double d = run.max_diff_to_replicated, spread = ranks.diff_to_rank0[k];
    const bool same_bits = d == 0, close = d <= rtol, ranks_equal = spread == 0;
    std::printf("ZeRO-%d check over %d processes: after %d steps every rank's parameters %s the replicated run's "
                "(largest difference %g) and %s rank 0's\n",
                run.stage, run.n, cfg.steps + 1, same_bits ? "equal" : close ? "equal within rounding" : "DIFFER from", d,
                ranks_equal ? "are the same bits as" : "DIFFER from");
    if (!(same_bits || close) || !ranks_equal) ++failed;
  }
  for (const auto& run : r.runs)
    if (run.trace_tasks > 0)
      std::printf("trace: one ZeRO-%d step over %d processes, %lld stream tasks, every rank in one timeline (the layers on "
                  "each rank's compute lane, the all-gathers and reduce-scatters on its comm lane) in %s\n",
                  run.stage, run.n, (long long)run.trace_tasks, cfg.trace_file.c_str());
  return failed;
}

}  // namespace d2l::sharding
