// The tables and check lines of chapter 5.
#include "chapters/sharding/report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>

#include "core/allocator.hpp"
#include "core/dist/process_group.hpp"
#include "core/plot.hpp"

namespace d2l::sharding {

// The steps from the same weights whose losses must agree to float32's rounding.
constexpr size_t kEqualSteps = 10;

void print_ladder(const ZeroResult& r) {
  std::map<int, std::map<int, int64_t>> peaks;  // N -> stage -> largest device's peak
  for (const auto& run : r.runs)
    for (const auto& m : run.rows) peaks[run.n][run.stage] = std::max(peaks[run.n][run.stage], m.peak_bytes);
  for (auto& [n, by_stage] : peaks) {
    if (by_stage.size() < 4) continue;
    const bool down = by_stage[0] > by_stage[1] && by_stage[1] > by_stage[2] && by_stage[2] > by_stage[3];
    const char* gt = n == 1 ? "," : " >";
    std::printf("ladder, N=%d: peak per device replicated %.2f MB%s ZeRO-1 %.2f%s ZeRO-2 %.2f%s ZeRO-3 %.2f MB (%.2fx, %.2fx, "
                "%.2fx the replicated run's): %s\n",
                n, by_stage[0] / 1e6, gt, by_stage[1] / 1e6, gt, by_stage[2] / 1e6, gt, by_stage[3] / 1e6,
                double(by_stage[1]) / double(by_stage[0]), double(by_stage[2]) / double(by_stage[0]),
                double(by_stage[3]) / double(by_stage[0]),
                n == 1 ? "one device, nothing to shard: no stage costs more than replication"
                : down ? "each stage below the one before"
                       : "NOT each stage below the one before");
  }
}

void print_memory_row(const MemoryRow& m, const std::string& where, const std::string& shard, int where_width,
                      int formula_width) {
  const std::string param_formula = m.stage == 3 ? "4*" + shard : "4*Psi";
  const std::string grad_formula = m.stage >= 2 ? "0" : "4*Psi";
  const std::string sum_formula = m.stage >= 2 ? "4*" + shard : "0";
  const std::string state_formula = m.stage == 0 ? "8*Psi" : "8*" + shard;
  const int w = formula_width;
  std::printf("%2d %5d %-*s %10lld %-*s %10lld %10lld %-6s %10lld %10lld %-*s %10lld %10lld %-*s %10lld %8lld %10lld %10lld",
              m.n, m.stage, where_width, where.c_str(), (long long)m.parameter_bytes, w, param_formula.c_str(),
              (long long)m.formula_parameter_bytes, (long long)m.gradient_bytes, grad_formula.c_str(),
              (long long)m.formula_gradient_bytes, (long long)m.summed_gradient_bytes, w, sum_formula.c_str(),
              (long long)m.formula_summed_gradient_bytes, (long long)m.state_bytes, w, state_formula.c_str(),
              (long long)m.formula_state_bytes, (long long)m.gathered_bytes, (long long)m.peak_bytes,
              (long long)m.peak_by_tag[static_cast<int>(MemoryTag::other)]);
}

double rounding_tolerance(DType autocast) {
  if (autocast == DType::bf16) return 10 * std::ldexp(1.0, -9);
  if (autocast == DType::f16) return 10 * std::ldexp(1.0, -12);
  return 1e-5;
}

void print_saved(const Config& cfg, const ZeroResult& r) {
  for (const auto& run : r.runs) {
    if (run.saved.empty()) continue;
    std::printf("saved: ZeRO-%d's run on %d %s as a sharded checkpoint in %s (io::load_sharded_checkpoint resumes it at "
                "any stage and number of devices or ranks):",
                run.stage, run.n, dist::world_size() > 1 ? "ranks" : "devices", cfg.save_dir.c_str());
    for (size_t i = 0; i < run.saved.size(); ++i)
      std::printf("%s %s %lld B", i ? "," : "", run.saved[i].first.c_str(), (long long)run.saved[i].second);
    std::printf("\n");
  }
}

int print_zero(const Config& cfg, const ZeroResult& r) {
  std::printf("\n1. Memory per device: replicated Adam (data parallelism, zero_stage 0) vs ZeRO-1, ZeRO-2 and ZeRO-3 "
              "(FSDP) (zero_stage 1, 2, 3)\n"
              "MLP 784 -> %lld (x %d layers of equal width) -> 10, Psi = %lld trainable float32 elements, Adam (K = 8 bytes of "
              "state an element), batch %lld split over the devices, %d timed steps\n",
              (long long)cfg.zero_hidden, cfg.zero_layers, (long long)r.psi, (long long)cfg.batch_size, cfg.steps);
  std::printf("%2s %5s %-8s %10s %-8s %10s %10s %-6s %10s %10s %-8s %10s %10s %-8s %10s %8s %10s %10s %11s %8s\n", "N",
              "stage", "device", "params B", "formula", "= B", ".grad B", "formula", "= B", "sum B", "formula", "= B",
              "state B", "formula", "= B", "gather B", "peak B", "act@peak", "sent B/step", "ms/step");
  for (const auto& run : r.runs)
    for (size_t i = 0; i < run.rows.size(); ++i) {
      const MemoryRow& m = run.rows[i];
      std::ostringstream device;
      device << m.device;
      print_memory_row(m, device.str(), (m.stage == 3 ? "Psi'_" : "Psi_") + std::to_string(i), 8, 8);
      std::printf(" %11lld", (long long)m.sent_bytes);
      if (i == 0) std::printf(" %8.2f", 1e3 * run.seconds_per_step);
      std::printf("\n");
    }
  std::printf("(Measured after the last step from the buffers each device's allocator handed out, by what they hold; "
              "formula: the ZeRO paper's model, Psi_i = floor(Psi (i+1) / N) - floor(Psi i / N); at stage 3 each layer u "
              "(FSDP's unit) is split by the same rule, and Psi'_i = the sum over the layers of shard i of Psi_u. params: "
              "the parameters, the shard at stage 3. .grad: the buffers autograd adds into, released at stages 2 and 3 "
              "once added into the shards. sum: the summed gradient kept apart from them, the shard's at stages 2 and 3 "
              "(at stages 0 and 1 the sum is written into the .grad buffers). gather: ZeRO-3's units still whole. "
              "peak: the most bytes in use at once during the timed steps; act@peak: of which activations and "
              "temporaries)\n");
  int failed = 0;
  for (const auto& run : r.runs) {
    for (const auto& m : run.rows)
      if (m.parameter_bytes != m.formula_parameter_bytes || m.gradient_bytes != m.formula_gradient_bytes ||
          m.state_bytes != m.formula_state_bytes || m.summed_gradient_bytes != m.formula_summed_gradient_bytes ||
          m.gathered_bytes != 0) {
        std::printf("memory check, N=%d, stage %d, %s: the bytes held differ from the paper's model\n", run.n, run.stage,
                    m.device.str().c_str());
        ++failed;
      }
    if (run.stage == 0) continue;
    const bool equal = run.max_diff_to_replicated == 0;
    std::printf("ZeRO-%d check, N=%d: after %d steps every replica's parameters %s the replicated run's (largest difference %g)\n",
                run.stage, run.n, cfg.steps + 1, equal ? "equal" : "DIFFER from", run.max_diff_to_replicated);
    if (!equal) ++failed;
  }
  // Bytes sent a step, all devices together, against the formula: an allreduce 2(N-1) Psi floats,
  // a reduce-scatter and an all-gather (N-1) Psi each.
  static const char* what[] = {"allreduce", "reduce-scatter + all-gather", "reduce-scatter in backward + all-gather",
                               "2 all-gathers + reduce-scatter"};
  for (const auto& run : r.runs) {
    const bool ok = run.sent_bytes == run.formula_sent_bytes;
    std::printf("bytes sent per step, N=%d, stage %d (%s): %lld, formula %d(N-1) * 4 * Psi = %lld%s", run.n, run.stage,
                what[run.stage], (long long)run.sent_bytes, run.stage == 3 ? 3 : 2,
                (long long)run.formula_sent_bytes, ok ? "" : " (DIFFERENT)");
    if ((run.stage == 1 || run.stage == 2) && run.n > 1)  // every device sends Psi + (N-2) Psi_i floats: 2(N-1)/N Psi to the rounding
      std::printf("; a device 2(N-1)/N * 4 * Psi = %.0f", 2.0 * (run.n - 1) / run.n * 4.0 * double(r.psi));
    if (run.skipped > 0)
      std::printf("; %lld of the %d timed steps skipped by the loss scaler, %s", (long long)run.skipped, cfg.steps,
                  run.stage == 1 || run.stage == 2 ? "without their all-gather (counted so in the formula)" : "sending as the others");
    std::printf("\n");
    if (!ok) ++failed;
  }
  // The peak a device reached, the largest over its devices, against the replicated run's at the same N.
  std::map<int, int64_t> replicated_peak;
  for (const auto& run : r.runs) {
    int64_t peak = 0;
    for (const auto& m : run.rows) peak = std::max(peak, m.peak_bytes);
    if (run.stage == 0) replicated_peak[run.n] = peak;
    else if (replicated_peak.count(run.n))
      std::printf("peak per device, N=%d, stage %d: %lld bytes, %.2fx the replicated run's %lld\n", run.n, run.stage,
                  (long long)peak, double(peak) / double(std::max<int64_t>(1, replicated_peak[run.n])),
                  (long long)replicated_peak[run.n]);
  }
  print_ladder(r);
  for (const auto& run : r.runs)
    if (run.trace_tasks > 0)
      std::printf("trace: one ZeRO-3 step on %d devices, %lld stream tasks (the gathers and the gradients' copies on the "
                  "copy lanes, the layers on the compute lanes) in %s\n",
                  run.n, (long long)run.trace_tasks, cfg.trace_file.c_str());
  print_saved(cfg, r);
  if (!cfg.plot_dir.empty()) plot_zero(cfg, r);
  return failed;
}

void plot_zero(const Config& cfg, const ZeroResult& r) {
  static const char* names[] = {"replicated (DDP)", "ZeRO-1", "ZeRO-2", "ZeRO-3 (FSDP)"};
  PlotSpec memory{"Peak memory per device, Adam, Psi = " + std::to_string(r.psi), "devices N", "MB (allocator peak, largest device)", {}};
  PlotSpec time{"Time of a step, Adam, batch " + std::to_string(cfg.batch_size), "devices N", "ms per step", {}};
  memory.key = "bottom left";  // the peaks fall from the top left
  time.key = "top left";
  // The paper's Figure 1 at the largest N: a bar per stage, what its largest device held at its peak.
  int n_max = 0;
  for (const auto& run : r.runs) n_max = std::max(n_max, run.n);
  StackedBarSpec held{"What a device holds at its peak, N = " + std::to_string(n_max) +
                          " (the ZeRO paper's Figure 1, measured)",
                      "MB (allocator peak, largest device)", {}, {}, {}};
  const MemoryTag tags[] = {MemoryTag::parameters, MemoryTag::gradients, MemoryTag::summed_gradients,
                            MemoryTag::optimizer_state, MemoryTag::gathered, MemoryTag::other};
  held.layers = {"parameters", ".grad", "summed gradients", "optimizer state", "gathered units",
                 "activations and temporaries"};
  held.values.resize(held.layers.size());
  for (int stage = 0; stage <= 3; ++stage) {
    Series m{names[stage], {}, {}, {}}, t{names[stage], {}, {}, {}};
    for (const auto& run : r.runs) {
      if (run.stage != stage) continue;
      int64_t peak = 0;
      for (const auto& row : run.rows) peak = std::max(peak, row.peak_bytes);
      m.x.push_back(run.n), m.y.push_back(double(peak) / 1e6);
      t.x.push_back(run.n), t.y.push_back(1e3 * run.seconds_per_step);
      if (run.n != n_max || run.rows.empty()) continue;
      const auto& largest = *std::max_element(run.rows.begin(), run.rows.end(), [](const MemoryRow& a, const MemoryRow& b) {
        return a.peak_bytes < b.peak_bytes;
      });
      held.labels.push_back(names[stage]);
      for (size_t l = 0; l < held.layers.size(); ++l)
        held.values[l].push_back(double(largest.peak_by_tag[static_cast<int>(tags[l])]) / 1e6);
    }
    if (m.x.empty()) continue;
    memory.series.push_back(m);
    time.series.push_back(t);
  }
  for (const auto& run : r.runs)  // whole numbers of devices on x: a tick at each N run
    if (std::find(memory.xtics.begin(), memory.xtics.end(), run.n) == memory.xtics.end()) memory.xtics.push_back(run.n);
  time.xtics = memory.xtics;
  auto report = [&](const char* file, const std::string& why) {
    const std::string path = cfg.plot_dir + "/" + file;
    if (why.empty()) std::printf("plot: %s\n", path.c_str());
    else std::printf("plot %s not drawn: %s\n", path.c_str(), why.c_str());
  };
  for (auto& [spec, file] : {std::pair{&memory, kMemoryPlot}, std::pair{&time, kStepTimePlot}})
    report(file, plot_png(*spec, cfg.plot_dir + "/" + file));
  report(kHeldPlot, stacked_bar_png(held, cfg.plot_dir + "/" + kHeldPlot));
}

void print_tensor_parallel_title(const Config& cfg) {
  std::printf("\n2. Tensor parallelism (Megatron-LM): 784 -> Dense(%lld, relu) -> [Dense(%lld, relu) -> Dense(%lld)] -> relu -> "
              "Dense(10), the bracketed MLP column- then row-parallel over %d devices; SGD lr %g, batch %lld on every device, %d epochs%s\n",
              (long long)cfg.d_model, (long long)cfg.hidden, (long long)cfg.d_model, cfg.tp_size, double(cfg.lr),
              (long long)cfg.batch_size, cfg.num_epochs,
              cfg.clip_grad_norm > 0 ? ("; the gradient clipped to norm " + std::to_string(cfg.clip_grad_norm)).c_str() : "");
  std::fflush(stdout);
}

int print_tensor_parallel(const Config& cfg, const TensorParallelResult& r) {
  std::printf("%5s %12s %12s %10s %12s %12s\n", "epoch", "loss 1 dev", "loss TP", "rel diff", "test acc 1", "test acc TP");
  double worst_acc = 0;
  for (size_t e = 0; e < r.unsharded.size() && e < r.sharded.size(); ++e) {
    const auto &a = r.unsharded[e], &b = r.sharded[e];
    const double rel = std::fabs(a.loss - b.loss) / std::max(1e-12, std::fabs(a.loss));
    worst_acc = std::max(worst_acc, std::fabs(a.test_acc - b.test_acc));
    std::printf("%5zu %12.6f %12.6f %10.2g %12.4f %12.4f\n", e + 1, a.loss, b.loss, rel, a.test_acc, b.test_acc);
  }
  // The sharded GEMMs and g's sum add in another order than the unsharded GEMM: the same function up
  // to rounding. From the same weights the first steps' losses agree to float32's rounding; SGD then
  // feeds each step's differences into the next, so over hundreds of steps they grow (a relu that
  // flips, a near-tie in the accuracy), and the curves agree to a few digits, not to the last bit.
  const size_t first = std::min<size_t>(kEqualSteps, std::min(r.unsharded_steps.size(), r.sharded_steps.size()));
  double early = 0, all = 0;
  for (size_t k = 0; k < std::min(r.unsharded_steps.size(), r.sharded_steps.size()); ++k) {
    const double rel = std::fabs(r.unsharded_steps[k] - r.sharded_steps[k]) / std::max(1e-12, std::fabs(r.unsharded_steps[k]));
    all = std::max(all, rel);
    if (k < first) early = std::max(early, rel);
  }
  // With clipping, each step's gradient norm over the slices against the unsplit MLP's.
  double norms = 0;
  for (size_t k = 0; k < std::min(first, std::min(r.unsharded_norms.size(), r.sharded_norms.size())); ++k)
    norms = std::max(norms, std::fabs(r.unsharded_norms[k] - r.sharded_norms[k]) / std::max(1e-30, std::fabs(r.unsharded_norms[k])));
  const double rtol = rounding_tolerance(cfg.autocast);
  const bool equal = first > 0 && early <= rtol && norms <= rtol;
  std::printf("TP check: the MLP over %d device%s %s the unsharded run within rounding over the first %zu steps "
              "(largest relative loss difference %.2g)\n",
              cfg.tp_size, cfg.tp_size == 1 ? "" : "s", equal ? "equals" : "DIFFERS from", first, early);
  std::printf("over all %zu steps the losses differ by at most %.2g relative; after training the test accuracies differ by %.4f "
              "and the logits by up to %.2g (rounding's differences, compounded by training)\n",
              r.unsharded_steps.size(), all, worst_acc, r.max_output_diff);
  if (cfg.clip_grad_norm > 0)
    std::printf("clipping: the gradient norm over the MLP's slices (each tensor once) against the unsharded model's over the "
                "first %zu steps: largest relative difference %.1e (the first step's %.4f, max norm %g)\n",
                first, norms, r.sharded_norms.empty() ? 0.0 : r.sharded_norms[0], double(cfg.clip_grad_norm));
  const bool bytes_ok = r.bytes_per_step == r.formula_bytes_per_step;
  std::printf("communication per step (batch %lld): %lld allreduces, %lld bytes summed (tp::traffic()); "
              "formula 2 * batch * d_model * 4 = 2 * %lld * %lld * 4 = %lld bytes%s\n",
              (long long)r.step_batch, (long long)r.allreduces_per_step, (long long)r.bytes_per_step, (long long)r.step_batch,
              (long long)cfg.d_model, (long long)r.formula_bytes_per_step, bytes_ok ? "" : " (DIFFERENT)");
  return (equal ? 0 : 1) + (bytes_ok ? 0 : 1);
}

}  // namespace d2l::sharding
