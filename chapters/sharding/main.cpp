// sharding: chapter 5, what data parallelism stores N times and two ways to store it once.
//   sharding                      both parts on 4 devices (CPU devices stand in without GPUs)
//   sharding memory --steps 50    1. ZeRO-1, 2 and 3 against replicated Adam: bytes per device, peak, time per step
//   sharding tp --tp-size 4       2. the Megatron MLP split over 4 devices against the unsharded net
//   mpirun -np 4 sharding grid    3. 2 dp x 2 tp over 4 processes against the unsharded net
//   sharding --quick              generated data, a few steps: seconds (tests)
//   mpirun -np 2 sharding memory  part 1 with ZeRO over the 2 processes, one device each
#include <CLI/CLI.hpp>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <system_error>

#include "chapters/harness/harness.hpp"
#include "chapters/sharding/report.hpp"
#include "chapters/sharding/sharding.hpp"
#include "core/cli.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "datasets/fashion_mnist.hpp"

namespace sh = d2l::sharding;

namespace {

// CLI11 clamps a whole number beyond int64's range to the limit: refuse it instead, as given.
CLI::Validator in_int64_range(const std::string& expected) {
  return CLI::Validator(
      [expected](std::string& s) -> std::string {
        const char *b = s.data(), *e = s.data() + s.size();
        if (b != e && *b == '+') ++b;
        int64_t v = 0;
        if (std::from_chars(b, e, v).ec == std::errc::result_out_of_range) return "bad value " + s + ": expected " + expected;
        return "";
      },
      "", "whole number in range");
}

// Checks that depend on the flags alone, the same on every rank once their flags agree: under
// mpirun a bad value is rank 0's one line (CollectiveError) and every rank exits 2, none aborts.
void on_every_rank(const std::function<void()>& checks) {
  try {
    checks();
  } catch (const d2l::ConfigError& e) {
    if (d2l::dist::world_size() > 1) throw d2l::dist::CollectiveError(e.what());
    throw;
  }
}

bool same_file(const std::string& a, const std::string& b) {
  std::error_code ec1, ec2;
  const auto ca = std::filesystem::weakly_canonical(a, ec1), cb = std::filesystem::weakly_canonical(b, ec2);
  return !ec1 && !ec2 && ca == cb;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Sharding: ZeRO stages 1 to 3 (the optimizer state, then the gradients, then the parameters split over the devices) and Megatron's tensor parallelism"};
  d2l::DeviceFlags dev;
  dev.num_gpus = 4;
  sh::Config cfg;
  bool quick = false;
  int64_t seed = 0;
  d2l::add_device_flags(app, dev);
  auto* memory = app.add_subcommand("memory", "1. memory per device and time per step: replicated Adam (DDP) vs ZeRO-1, ZeRO-2 and ZeRO-3 (FSDP)");
  auto* tp = app.add_subcommand("tp", "2. tensor parallelism: the Megatron MLP split over --tp-size devices vs unsharded");
  auto* grid = app.add_subcommand("grid", "3. the grid over processes (mpirun -np 4): the MLP split over each tp group of --tp-size processes, the batch over the dp groups");
  app.require_subcommand(0, 1);
  for (auto* sub : {memory, tp, grid}) sub->fallthrough();  // flags may follow the subcommand
  const auto whole = in_int64_range("a whole number from -2^63 to 2^63 - 1");
  auto* batch = app.add_option("--batch-size", cfg.batch_size, "minibatch size (split over the devices in part 1, whole on every device in part 2)")->capture_default_str()->check(whole);
  auto* steps = app.add_option("--steps", cfg.steps, "part 1: timed Adam steps per run (after one warm-up step)")->capture_default_str();
  app.add_option("--zero-stage", cfg.zero_stage, "part 1: the last stage run beside the replicated one: 3 (ZeRO-1, ZeRO-2 and ZeRO-3), 2, 1 or 0 (the replicated rows only)")->capture_default_str();
  app.add_option("--adam-lr", cfg.adam_lr, "part 1: Adam's learning rate")->capture_default_str();
  app.add_option("--clip-grad-norm", cfg.clip_grad_norm, "every part: clip the gradient's global norm to this (torch.nn.utils.clip_grad_norm_), over every shard and tensor-parallel slice; 0: off")->capture_default_str();
  app.add_option("--grid-zero-stage", cfg.grid_zero_stage, "the grid: its SGD state over each dp group: 1 sharded (ZeRO-1 on the dp group, Megatron's distributed optimizer), 2 the summed gradients sharded too, 0 replicated")->capture_default_str();
  app.add_option("--reduce-bucket-mb", cfg.reduce_bucket_mb, "part 1 under mpirun: MiB of gradients ZeRO-2 packs into one reduce-scatter during backward (DeepSpeed's reduce_bucket_size, DDP's bucket_cap_mb; 0: one per parameter, unpacked)")->capture_default_str();
  app.add_option("--lr", cfg.lr, "part 2 and the grid: SGD's learning rate")->capture_default_str();
  auto* epochs = app.add_option("--num-epochs", cfg.num_epochs, "part 2 and the grid: epochs of each run")->capture_default_str();
  app.add_option("--tp-size", cfg.tp_size, "part 2: devices the Megatron MLP is split over (the first of --devices); grid: processes per tp group (dividing the processes)")->capture_default_str();
  app.add_option("--hidden", cfg.hidden, "part 2 and the grid: the MLP's hidden width, split over --tp-size devices")->capture_default_str()->check(whole);
  app.add_option("--d-model", cfg.d_model, "part 2 and the grid: the MLP's input and output width")->capture_default_str()->check(whole);
  app.add_option("--out-dir", cfg.plot_dir, std::string("part 1 as one process: write ") + sh::kMemoryPlot + ", " + sh::kStepTimePlot + " and " + sh::kHeldPlot + " here ('' for none)");
  app.add_option("--trace", cfg.trace_file, "part 1 only, Chrome-trace JSON (Perfetto): as one process one ZeRO-3 step on all the devices (--zero-stage 3); under mpirun the last timed step of the last stage run, every rank in one timeline");
  app.add_option("--save", cfg.save_dir, "part 1: its last run (the last stage, on the most devices or over every rank) as a sharded checkpoint in this directory: a file per rank, the parameters, index.json");
  app.add_option("--load", cfg.load_dir, "part 1: every run starts from this sharded checkpoint's parameters and optimizer state (a --save of any stage, devices or ranks), resharded into the run's layout");
  app.add_option("--data-dir", cfg.data_dir, "Fashion-MNIST (or any IDX) directory; default $D2L_DATA_DIR, then Debian's dataset-fashion-mnist");
  app.add_option("--seed", seed, "seed of the initial parameters and of the minibatch order (0 to 2^63 - 1)")->capture_default_str()->check(in_int64_range("0 to 2^63 - 1"));
  d2l::harness::Precision precision;  // the GPU GEMMs of the nets
  precision.mixed = true;  // --precision bf16 / fp16: part 1's and the grid's steps under autocast
  precision.add_flags(app);
  app.add_flag("--quick", quick, "generated 28x28 images (1024 training, 256 test), batch 64, 10 steps, 2 epochs: seconds");
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop between steps, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    const int W = d2l::dist::world_size();  // under mpirun part 1 uses the first device of each rank
    const bool all = !*memory && !*tp && !*grid;
    // Under mpirun the whole chapter is part 1 over the ranks, then the grid over them (part 2 is the
    // devices of one process; `tp` still runs it, on every rank).
    const bool run_memory = all || *memory, run_grid = *grid || (all && W > 1), run_tp = *tp || (all && W == 1);
    // Every rank must run the same parts with the same sizes, or a collective would wait forever or
    // get buffers of another size: first the flags as given, all but the paths of a rank's own files.
    // Whether --trace is given is not a rank's own (under mpirun every rank adds to the one timeline),
    // nor whether --out-dir is (refused under mpirun: on every rank alike).
    d2l::dist::Fingerprint flags{{"program", "sharding"},
                                 {"part", all ? "all" : app.get_subcommands()[0]->get_name()},
                                 {"--trace", cfg.trace_file.empty() ? "off" : "on"},
                                 {"--out-dir", cfg.plot_dir.empty() ? "off" : "on"}};
    for (auto& f : d2l::harness::flag_fingerprint(app, {"--out-dir", "--trace", "--data-dir"})) flags.push_back(f);
    d2l::dist::check_same_config(flags);
    precision.apply();
    cfg.autocast = precision.autocast();
    on_every_rank([&] {
      if (seed < 0) throw d2l::ConfigError("bad --seed " + std::to_string(seed) + ": expected 0 to 2^63 - 1");
      cfg.seed = static_cast<uint64_t>(seed);
      sh::Config given = cfg;
      if (quick) sh::make_quick(cfg);  // flags given explicitly keep their values
      if (*batch) cfg.batch_size = given.batch_size;
      if (*steps) cfg.steps = given.steps;
      if (*epochs) cfg.num_epochs = given.num_epochs;
      d2l::require_positive("--batch-size", static_cast<double>(cfg.batch_size));
      if (run_memory) {
        d2l::require_positive("--steps", cfg.steps);
        d2l::require_at_most("--steps", cfg.steps, 1e6, "steps");
        d2l::require_positive("--adam-lr", cfg.adam_lr);
        if (!(cfg.reduce_bucket_mb >= 0))
          throw d2l::ConfigError("bad --reduce-bucket-mb " + std::to_string(cfg.reduce_bucket_mb) + ": expected a number >= 0");
        d2l::require_at_most("--reduce-bucket-mb", cfg.reduce_bucket_mb, 1e4, "MiB");
      }
      if (!(std::isfinite(cfg.clip_grad_norm) && cfg.clip_grad_norm >= 0))
        throw d2l::ConfigError("bad --clip-grad-norm " + std::to_string(cfg.clip_grad_norm) + ": expected a finite number >= 0 (0: off)");
      if (run_grid && (cfg.grid_zero_stage < 0 || cfg.grid_zero_stage > 2))
        throw d2l::ConfigError("bad --grid-zero-stage " + std::to_string(cfg.grid_zero_stage) + ": expected 0, 1 or 2");
      if (run_tp || run_grid) {
        d2l::require_positive("--lr", cfg.lr);
        d2l::require_positive("--num-epochs", cfg.num_epochs);
        d2l::require_at_most("--num-epochs", cfg.num_epochs, 1e4, "epochs");
        d2l::require_positive("--hidden", static_cast<double>(cfg.hidden));
        d2l::require_at_most("--hidden", static_cast<double>(cfg.hidden), 1 << 16, "hidden units");
        d2l::require_positive("--d-model", static_cast<double>(cfg.d_model));
        d2l::require_at_most("--d-model", static_cast<double>(cfg.d_model), 1 << 14, "features");
      }
      // Files of a part that does not run here would silently stay unwritten.
      if (!run_memory && !cfg.load_dir.empty())
        throw d2l::ConfigError("bad --load " + cfg.load_dir + ": it loads part 1 (memory), which this run does not run");
      if (!cfg.load_dir.empty() && !std::filesystem::is_regular_file(std::filesystem::path(cfg.load_dir) / "index.json"))
        throw d2l::ConfigError("bad --load " + cfg.load_dir + ": no index.json there (not a sharded checkpoint of --save)");
      if (!run_memory && !cfg.save_dir.empty())
        throw d2l::ConfigError("bad --save " + cfg.save_dir + ": it saves part 1 (memory), which this run does not run");
      if (!run_memory && !cfg.trace_file.empty())
        throw d2l::ConfigError("bad --trace " + cfg.trace_file + ": it traces part 1 (memory), which this run does not run");
      if (!cfg.plot_dir.empty() && (!run_memory || W > 1))
        throw d2l::ConfigError("bad --out-dir " + cfg.plot_dir + ": it holds the plots of part 1 as one process, " +
                               (W > 1 ? "which this run (under mpirun) draws none of" : "which this run does not run"));
      if (run_grid) sh::validate_grid(cfg);  // one device per process: --tp-size against the processes
    });
    for (const char* plot : {sh::kMemoryPlot, sh::kStepTimePlot, sh::kHeldPlot})
      if (!cfg.plot_dir.empty() && !cfg.trace_file.empty() && same_file(cfg.trace_file, cfg.plot_dir + "/" + plot))
        throw d2l::ConfigError("bad --trace " + cfg.trace_file + ": the plot " + plot + " of --out-dir would overwrite it");
    // An example's 784 features and the activations of the widest net: well under 16 kB.
    d2l::require_memory("--batch-size", static_cast<double>(cfg.batch_size), 16e3 * static_cast<double>(cfg.batch_size));
    d2l::check_output_dir("--out-dir", cfg.plot_dir, {sh::kMemoryPlot, sh::kStepTimePlot, sh::kHeldPlot});
    d2l::check_output_path("--trace", cfg.trace_file);
    // --save DIR: an existing directory whose files can be replaced, or one that can be made.
    if (std::filesystem::exists(cfg.save_dir)) d2l::check_output_dir("--save", cfg.save_dir, {"index.json", "parameters.safetensors"});
    else d2l::check_output_path("--save", cfg.save_dir);
    cfg.devices = d2l::choose_devices(dev, d2l::dist::rank() == 0);
    d2l::dist::check_same_config({{"devices per process", std::to_string(cfg.devices.size())}});
    on_every_rank([&] {
      if (run_memory) sh::validate_memory(cfg, W);
      if (run_tp) sh::validate_tp(cfg);
    });
    sh::load_data(cfg);
    int64_t features = 1;
    for (int64_t s : cfg.train_data->feature_shape) features *= s;
    // Then what follows from the flags and each rank's data: the same examples and image size everywhere.
    d2l::dist::check_same_config({{"training examples", std::to_string(cfg.train_data->n)},
                                  {"test examples", std::to_string(cfg.test_data->n)},
                                  {"image shape", d2l::dist::shape_text(cfg.train_data->feature_shape)},
                                  {"test image shape", d2l::dist::shape_text(cfg.test_data->feature_shape)}});
    on_every_rank([&] {
      if (cfg.test_data->feature_shape != cfg.train_data->feature_shape)
        throw d2l::ConfigError("bad data in '" + d2l::resolve_data_dir(cfg.data_dir).path + "': the test images, " +
                               d2l::dist::shape_text(cfg.test_data->feature_shape) +
                               ", differ in shape from the training images, " +
                               d2l::dist::shape_text(cfg.train_data->feature_shape));
      if (run_memory && (W == 1 || cfg.devices.size() > 1)) sh::validate_short_batch(cfg, W);
    });
    // The nets' sizes together, before any of them is allocated.
    const std::string sizes = "--hidden " + std::to_string(cfg.hidden) + " with --d-model " + std::to_string(cfg.d_model) +
                              " and --batch-size " + std::to_string(cfg.batch_size);
    if (run_tp) d2l::require_memory_of(sizes, sh::classifier_bytes(cfg, features, 1, false));
    if (run_grid) d2l::require_memory_of(sizes, sh::classifier_bytes(cfg, features, W, true));
    const std::string where = *grid ? sh::grid_devices(cfg)
                              : W > 1 ? std::to_string(W) + " processes, each on " + d2l::str(cfg.devices) + " (part 1: " +
                                            d2l::str(std::vector<d2l::Device>{cfg.devices[0]}) + " of each" +
                                            (cfg.devices.size() > 1 ? ", then all " + std::to_string(cfg.devices.size()) + " in 1b" : "") + ")"
                                      : d2l::str(cfg.devices);
    std::printf("running on: %s; data: %s\n", where.c_str(),
                quick ? "generated 28x28 images (--quick)" : ("Fashion-MNIST from " + d2l::resolve_data_dir(cfg.data_dir).path).c_str());
    std::fflush(stdout);
    std::vector<std::string> failed_parts;
    int failed = 0;
    auto count = [&](int n, const char* part) {
      if (n > 0) failed += n, failed_parts.push_back(part);
    };
    if (run_memory) {
      if (!cfg.load_dir.empty())
        std::printf("--load: every run of part 1 starts from the sharded checkpoint in %s, resharded into its layout\n",
                    cfg.load_dir.c_str());
      try {
        if (W > 1) {  // under mpirun: ZeRO over the ranks (zero_processes.cpp), then over ranks x devices (hybrid.cpp)
          count(sh::print_zero_over_ranks(cfg, sh::zero_memory_over_ranks(cfg)), "part 1 (ZeRO)");
          if (cfg.devices.size() > 1) count(sh::print_hybrid(cfg, sh::hybrid_over_ranks(cfg)), "part 1b (hybrid sharding)");
        } else
          count(sh::print_zero(cfg, sh::zero_memory(cfg)), "part 1 (ZeRO)");
      } catch (const d2l::DivergedError& e) {  // part 1's learning rate is --adam-lr
        std::string why = e.what();
        if (auto at = why.rfind("--lr"); at != std::string::npos) why.replace(at, 4, "--adam-lr");
        throw d2l::DivergedError(why);
      }
    }
    if (run_tp) {
      sh::print_tensor_parallel_title(cfg);
      count(sh::print_tensor_parallel(cfg, sh::tensor_parallel(cfg)), "part 2 (tensor parallelism)");
    }
    if (run_grid) count(sh::grid_over_processes(cfg), "part 3 (the grid)");
    if (failed && d2l::dist::rank() == 0) {
      std::string parts;
      for (const auto& p : failed_parts) parts += (parts.empty() ? "" : ", ") + p;
      std::fprintf(stderr, "error: %d check(s) failed in %s: see above the figures unlike their formula and the lines "
                   "marked DIFFER\n", failed, parts.c_str());
    }
    return failed ? 1 : 0;
  });
}
