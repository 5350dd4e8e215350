// multi_gpu_scratch: d2l "Multi-GPU Training" from scratch (13.5).
//   multi_gpu_scratch --num-gpus 2 --batch-size 256 --lr 0.2     (the book's train(...))
//   multi_gpu_scratch demo                                        (get_params, allreduce, split)
//   multi_gpu_scratch --num-gpus 2 --trace run.json               (the devices' timeline, Perfetto)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/activation.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Multi-GPU training from scratch: LeNet, get_params, allreduce, split_batch, train"};
  d2l::DeviceFlags dev;
  d2l::scratch::Config cfg;
  bool quick = false;
  d2l::harness::Trace trace;
  d2l::harness::Conv conv;
  d2l::add_device_flags(app, dev);
  auto* batch = app.add_option("--batch-size", cfg.batch_size, "minibatch size (split over the devices)")->capture_default_str();
  auto* lr = app.add_option("--lr", cfg.lr, "learning rate")->capture_default_str();
  auto* epochs = app.add_option("--num-epochs", cfg.num_epochs, "epochs")->capture_default_str();
  app.add_option("--seed", cfg.seed, "seed for the initial parameters and the shuffling")
      ->check([](const std::string& v) { return v.find('-') == std::string::npos ? "" : "expected a number >= 0"; })
      ->capture_default_str();
  app.add_option("--data-dir", cfg.data_dir, "Fashion-MNIST (or any IDX) directory; default $D2L_DATA_DIR, then Debian's dataset-fashion-mnist");
  app.add_flag("--scale-batch", cfg.scale_batch, "exercise 1: use batch k*b on k devices");
  app.add_flag("--scale-lr", cfg.scale_lr, "exercise 2: multiply the learning rate by the device count");
  app.add_option("--allreduce", cfg.allreduce, "exercise 3: naive (the book's) or ring")->capture_default_str();
  app.add_flag("--eval-all-devices", cfg.eval_all_devices, "exercise 4: every device evaluates a shard of the test set");
  app.add_option("--activation", cfg.activation, "exercise 5: lenet's activation, " + d2l::nn::activation_names() + " (sigmoid: LeNet's original)")->capture_default_str();
  app.add_flag("--dist", cfg.dist, "data parallel over the processes of mpirun too: gradients summed over the devices, then across the processes");
  app.add_option("--bucket-mb", cfg.bucket_mb, "--dist: DDP's gradient buckets of this many MB, allreduced during backward (0: one per parameter; -1: none, one allreduce per parameter after backward)")->capture_default_str();
  app.add_option("--dist-allreduce", cfg.dist_allreduce, "--dist: library (MPI_Allreduce), ring (ours over MPI point-to-point) or naive (everything to rank 0 and back)")->capture_default_str();
  app.add_option("--plot", cfg.plot, "PNG of test accuracy per epoch ('' for none)")->capture_default_str();
  trace.add_flags(app);
  conv.precision.mixed = true;  // --precision bf16 / fp16: train_batch runs under autocast
  conv.add_flags(app);
  const auto& q = d2l::scratch::kQuick;
  char quick_help[128];
  std::snprintf(quick_help, sizeof quick_help, "a generated data set, batch %lld, lr %g, %d epochs: seconds on a CPU (tests)",
                (long long)q.batch_size, static_cast<double>(q.lr), q.num_epochs);
  app.add_flag("--quick", quick, quick_help);
  auto* demo = app.add_subcommand("demo", "the section's demonstrations: get_params, allreduce, split_and_load");
  demo->fallthrough();
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop after the current minibatch, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    // Every flag is checked before any work starts (bad input: exit 2, one line naming the flag).
    trace.check();
    conv.apply();
    cfg.autocast = conv.precision.autocast();
    if (quick) {  // flags given explicitly keep their values
      d2l::scratch::Config given = cfg;
      d2l::scratch::make_quick(cfg);
      if (*batch) cfg.batch_size = given.batch_size;
      if (*lr) cfg.lr = given.lr;
      if (*epochs) cfg.num_epochs = given.num_epochs;
    }
    if (!*demo) {
      d2l::require_positive("--batch-size", static_cast<double>(cfg.batch_size));
      // A 28x28 example needs about 200 kB over forward and backward (conv1's 20x26x26 output and
      // its gradient dominate); k devices with --scale-batch hold k times that in all.
      d2l::require_memory("--batch-size", static_cast<double>(cfg.batch_size), 2e5 * static_cast<double>(cfg.batch_size));
      d2l::require_positive("--lr", cfg.lr);
      d2l::require_positive("--num-epochs", cfg.num_epochs);
      if (cfg.allreduce != "naive" && cfg.allreduce != "ring")
        throw d2l::ConfigError("bad --allreduce '" + cfg.allreduce + "': expected naive or ring");
      d2l::scratch::activation_by_name(cfg.activation);
      d2l::check_output_path("--plot", cfg.plot);
      if (cfg.dist) d2l::dist::check_algorithm("--dist-allreduce", cfg.dist_allreduce);
      if (!std::isfinite(cfg.bucket_mb) || cfg.bucket_mb > 1e6)
        throw d2l::ConfigError("bad --bucket-mb: expected a number of MB up to 1e6 (0: one bucket per parameter; < 0: none)");
    }
    if (d2l::dist::world_size() > 1 && !cfg.dist && !*demo)
      throw d2l::ConfigError("started as " + std::to_string(d2l::dist::world_size()) +
                             " processes by mpirun: add --dist to train them together (or run one process)");
    // What may differ between the ranks: where each reads its data and writes its files.
    cfg.flags = d2l::harness::flag_fingerprint(app, {"--data-dir", "--plot", "--trace"});
    if (d2l::dist::rank() > 0) cfg.verbose = false, cfg.plot = "";  // one voice: rank 0 prints and plots
    cfg.devices = d2l::choose_devices(dev, d2l::dist::rank() == 0);
    if (cfg.scale_batch)
      d2l::require_memory("--batch-size", static_cast<double>(cfg.batch_size),
                          2e5 * static_cast<double>(cfg.batch_size) * static_cast<double>(cfg.devices.size()));
    trace.start();
    if (*demo)
      d2l::scratch::demo(cfg.devices);
    else
      d2l::scratch::train(cfg);
    trace.finish();
    return 0;
  });
}
