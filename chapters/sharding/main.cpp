// sharding: chapter 5, what data parallelism stores N times and two ways to store it once.
//   sharding                      both parts on 4 devices (CPU devices stand in without GPUs)
//   sharding memory --steps 50    1. ZeRO-1, 2 and 3 against replicated Adam: bytes per device, peak, time per step
//   sharding tp --tp-size 4       2. the Megatron MLP split over 4 devices against the unsharded net
//   mpirun -np 4 sharding grid    3. 2 dp x 2 tp over 4 processes against the unsharded net
//   sharding --quick              generated data, a few steps: seconds (tests)
//   mpirun -np 2 sharding memory  part 1 with ZeRO over the 2 processes, one device each
#include <CLI/CLI.hpp>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "chapters/sharding/report.hpp"
#include "chapters/sharding/sharding.hpp"
#include "core/cli.hpp"
#include "core/dist/process_group.hpp"
#include "datasets/fashion_mnist.hpp"

namespace sh = d2l::sharding;

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
  auto* batch = app.add_option("--batch-size", cfg.batch_size, "minibatch size (split over the devices in part 1, whole on every device in part 2)")->capture_default_str();
  auto* steps = app.add_option("--steps", cfg.steps, "part 1: timed Adam steps per run (after one warm-up step)")->capture_default_str();
  app.add_option("--zero-stage", cfg.zero_stage, "part 1: the last stage run beside the replicated one: 3 (ZeRO-1, ZeRO-2 and ZeRO-3), 2, 1 or 0 (the replicated rows only)")->capture_default_str();
  app.add_option("--adam-lr", cfg.adam_lr, "part 1: Adam's learning rate")->capture_default_str();
  app.add_option("--lr", cfg.lr, "part 2: SGD's learning rate")->capture_default_str();
  auto* epochs = app.add_option("--num-epochs", cfg.num_epochs, "part 2: epochs of each run")->capture_default_str();
  app.add_option("--tp-size", cfg.tp_size, "part 2: devices the Megatron MLP is split over (the first of --devices); grid: processes per tp group (dividing the processes)")->capture_default_str();
  app.add_option("--hidden", cfg.hidden, "part 2: the MLP's hidden width, split over --tp-size devices")->capture_default_str();
  app.add_option("--d-model", cfg.d_model, "part 2: the MLP's input and output width")->capture_default_str();
  app.add_option("--out-dir", cfg.plot_dir, std::string("part 1: write ") + sh::kMemoryPlot + " and " + sh::kStepTimePlot + " here ('' for none)");
  app.add_option("--trace", cfg.trace_file, "part 1: one ZeRO-3 step on all the devices, Chrome-trace JSON (Perfetto)");
  app.add_option("--data-dir", cfg.data_dir, "Fashion-MNIST (or any IDX) directory; default $D2L_DATA_DIR, then Debian's dataset-fashion-mnist");
  app.add_option("--seed", seed, "seed of the initial parameters and of the minibatch order")->capture_default_str();
  d2l::harness::Precision precision;  // the GPU GEMMs of the nets
  precision.add_flags(app);
  app.add_flag("--quick", quick, "generated 28x28 images (1024 training, 256 test), batch 64, 10 steps, 2 epochs: seconds");
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop between steps, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    precision.apply();
    if (seed < 0) throw d2l::ConfigError("bad --seed " + std::to_string(seed) + ": expected a number >= 0");
    cfg.seed = static_cast<uint64_t>(seed);
    sh::Config given = cfg;
    if (quick) sh::make_quick(cfg);  // flags given explicitly keep their values
    if (*batch) cfg.batch_size = given.batch_size;
    if (*steps) cfg.steps = given.steps;
    if (*epochs) cfg.num_epochs = given.num_epochs;
    d2l::require_positive("--batch-size", static_cast<double>(cfg.batch_size));
    // An example's 784 features and the activations of the widest net: well under 16 kB.
    d2l::require_memory("--batch-size", static_cast<double>(cfg.batch_size), 16e3 * static_cast<double>(cfg.batch_size));
    d2l::require_positive("--steps", cfg.steps);
    d2l::require_at_most("--steps", cfg.steps, 1e6, "steps");
    d2l::require_positive("--adam-lr", cfg.adam_lr);
    d2l::require_positive("--lr", cfg.lr);
    d2l::require_positive("--num-epochs", cfg.num_epochs);
    d2l::require_at_most("--num-epochs", cfg.num_epochs, 1e4, "epochs");
    d2l::require_positive("--hidden", static_cast<double>(cfg.hidden));
    d2l::require_at_most("--hidden", static_cast<double>(cfg.hidden), 1 << 16, "hidden units");
    d2l::require_positive("--d-model", static_cast<double>(cfg.d_model));
    d2l::require_at_most("--d-model", static_cast<double>(cfg.d_model), 1 << 14, "features");
    d2l::check_output_dir("--out-dir", cfg.plot_dir, {sh::kMemoryPlot, sh::kStepTimePlot});
    d2l::check_output_path("--trace", cfg.trace_file);
    cfg.devices = d2l::choose_devices(dev);
    const bool all = !*memory && !*tp && !*grid;
    const int W = d2l::dist::world_size();  // under mpirun part 1 uses the first device of each rank
    // Under mpirun the whole chapter is part 1 over the ranks, then the grid over them (part 2 is the
    // devices of one process; `tp` still runs it, on every rank).
    const bool run_grid = *grid || (all && W > 1), run_tp = *tp || (all && W == 1);
    if (run_grid) sh::validate_grid(cfg);  // one device per process: --tp-size against the processes
    if (!*grid) sh::validate(cfg);
    sh::load_data(cfg);
    const std::string where = *grid ? sh::grid_devices(cfg)
                              : W > 1 ? std::to_string(W) + " processes, each on " + d2l::str(cfg.devices) + " (part 1: " +
                                            d2l::str(std::vector<d2l::Device>{cfg.devices[0]}) + " of each)"
                                      : d2l::str(cfg.devices);
    std::printf("running on: %s; data: %s\n", where.c_str(),
                quick ? "generated 28x28 images (--quick)" : ("Fashion-MNIST from " + d2l::resolve_data_dir(cfg.data_dir).path).c_str());
    std::fflush(stdout);
    int failed = 0;
    if ((all || *memory) && d2l::dist::world_size() > 1)  // under mpirun: ZeRO over the ranks (zero_processes.cpp)
      failed += sh::print_zero_over_ranks(cfg, sh::zero_memory_over_ranks(cfg));
    else if (all || *memory)
      failed += sh::print_zero(cfg, sh::zero_memory(cfg));
    if (run_tp) {
      sh::print_tensor_parallel_title(cfg);
      failed += sh::print_tensor_parallel(cfg, sh::tensor_parallel(cfg));
    }
    if (run_grid) failed += sh::grid_over_processes(cfg);
    if (failed && d2l::dist::rank() == 0) std::fprintf(stderr, "error: %d check(s) failed: the sharded runs differ from the unsharded ones\n", failed);
    return failed ? 1 : 0;
  });
}
