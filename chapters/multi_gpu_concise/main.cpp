// multi_gpu_concise: d2l "Gluon implementation for multi-GPU computation" (now "Concise Implementation
// for Multiple GPUs", 13.6; 8.5 in the Chinese edition) and the Gluon lab on training with several GPUs.
//   multi_gpu_concise                         (the book's two runs: train(1, 256, 0.1), train(2, 512, 0.2))
//   multi_gpu_concise --num-gpus 2 --kvstore local --sync-bn
//   multi_gpu_concise --model lab-cnn         (the lab's runs: run(1, 64, .3), run(2, 128, .3))
//   multi_gpu_concise demo | lab              (the sections' cells: replicas, outputs, gradients)
//   multi_gpu_concise --load-params net.safetensors   (evaluate a saved net, ours or PyTorch's)
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/cli.hpp"
#include "core/dist/buckets.hpp"
#include "core/dist/process_group.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"
#include "datasets/idx.hpp"

namespace concise = d2l::concise;

static std::string number(float v) {  // 0.1f -> "0.1"
  char b[32];
  std::snprintf(b, sizeof b, "%g", static_cast<double>(v));
  return b;
}

static bool any_gpu(const std::vector<d2l::Device>& devices) {
  return std::any_of(devices.begin(), devices.end(), [](d2l::Device d) { return d.kind == d2l::DeviceKind::gpu; });
}

int main(int argc, char** argv) {
  CLI::App app{"Concise multi-GPU training: resnet18, initialize on several devices, split_and_load, Trainer, train"};
  d2l::DeviceFlags dev;
  concise::Config cfg;
  bool quick = false, full = false;
  std::string plot = "multi_gpu_concise.png", load_params;
  d2l::harness::Trace trace;
  d2l::harness::Conv conv;
  d2l::add_device_flags(app, dev);
  auto* batch = app.add_option("--batch-size", cfg.batch_size, "the whole minibatch, split over the devices [default: " + std::to_string(concise::kBookResNet18.batch_per_device) +
                                  " per device; lab-cnn " + std::to_string(concise::kLabCnn.batch_per_device) + "]");
  auto* lr = app.add_option("--lr", cfg.lr, "learning rate [default: " + number(concise::kBookResNet18.lr_per_device) +
                               " per device; lab-cnn " + number(concise::kLabCnn.lr_per_device) + "]");
  auto* epochs = app.add_option("--num-epochs", cfg.num_epochs, "epochs [default: " + std::to_string(concise::kBookResNet18.num_epochs) + "; lab-cnn " +
                                       std::to_string(concise::kLabCnn.num_epochs) + "]");
  app.add_option("--model", cfg.model, "resnet18 (the book's) or lab-cnn (the lab's)")->capture_default_str();
  app.add_option("--bucket-mb", cfg.bucket_mb, "dist_sync: DDP's gradient buckets of this many MB, allreduced during backward (0: one per parameter; -1: none)")->capture_default_str();
  std::string comm_hook = "allreduce";
  app.add_option("--comm-hook", comm_hook, "dist_sync's buckets: allreduce (float32), bf16_compress or fp16_compress (summed in 16 bits, half the bytes), as DDP's communication hooks")->capture_default_str();
  app.add_option("--kvstore", cfg.kvstore, "where gradients are summed: device, local (host memory), ring, or across the processes of mpirun: dist_sync (MPI_Allreduce), dist_sync_ring (our ring)")->capture_default_str();
  app.add_flag("--sync-bn", cfg.sync_bn, "BatchNorm statistics over the whole batch, all devices (SyncBatchNorm)");
  std::string split_weights, threads;
  auto* split_weights_opt = app.add_option("--split-weights", split_weights, "exercise 2: shard sizes in proportion to these, one per device (e.g. 3,1)");
  app.add_flag("--balance", cfg.balance, "exercise 2: measure each device's speed first and split in proportion");
  auto* threads_opt = app.add_option("--threads", threads, "kernel threads of each CPU device (one count, or one per device)");
  app.add_option("--in-flight", cfg.in_flight, "minibatches enqueued ahead of the one whose loss is checked (1 to 4)")->capture_default_str();
  app.add_flag("--eval-all-devices", cfg.eval_all_devices, "every device evaluates a shard of each test batch");
  int64_t seed = 0;
  auto* seed_opt = app.add_option("--seed", seed, "seed of the initial parameters and the shuffling")->capture_default_str();
  app.add_option("--data-dir", cfg.data_dir, "Fashion-MNIST (or any IDX) directory; default $D2L_DATA_DIR, then Debian's dataset-fashion-mnist");
  auto* train_subset = app.add_option("--train-subset", cfg.train_subset, "train on the first N training images (slow machines)");
  auto* test_subset = app.add_option("--test-subset", cfg.test_subset, "evaluate on the first N test images");
  app.add_flag("--full", full, "the book's whole recipe on CPU devices too (all 60000 training images)");
  app.add_option("--save-params", cfg.save_params, "save the trained net here (safetensors, PyTorch's names)");
  app.add_option("--load-params", load_params, "evaluate the net in this file (saved by --save-params or by PyTorch) instead of training");
  app.add_option("--checkpoint", cfg.checkpoint, "write a checkpoint here after every epoch");
  app.add_option("--resume", cfg.resume, "continue training from this checkpoint");
  app.add_option("--plot", plot, "PNG of test accuracy per epoch ('' for none)")->capture_default_str();
  trace.add_flags(app);
  conv.precision.mixed = true;  // --precision bf16 / fp16: train() runs forward and backward under autocast
  conv.add_flags(app);
  app.add_flag("--quick", quick, "a generated data set, small images, 3 epochs: seconds on a CPU (tests)");
  auto* demo = app.add_subcommand("demo", "the section's cells (d2l \"Concise Implementation for Multiple GPUs\"): resnet18 on two devices, split_and_load, weight.data()");
  auto* lab = app.add_subcommand("lab", "the Gluon lab's cells: the lab's CNN, its weights and gradients on each device");
  demo->fallthrough();
  lab->fallthrough();
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop after the current minibatch, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    try {
      // Every output path and flag is checked before any work.
      if (*split_weights_opt) cfg.split_weights = d2l::parse_list("--split-weights", split_weights, false);
      if (*threads_opt)
        for (int64_t t : d2l::parse_int_list("--threads", threads, false))
          cfg.threads.push_back(static_cast<int>(std::clamp<int64_t>(t, -1, 1 << 20)));  // the range is checked with the devices
      trace.check();
      conv.apply();
      cfg.autocast = conv.precision.autocast();
      cfg.comm_type = d2l::dist::comm_hook_type("--comm-hook", comm_hook);
      d2l::check_output_path("--plot", plot);
      if (!load_params.empty()) d2l::harness::check_readable("--load-params", load_params);
      if (*train_subset) d2l::require_positive("--train-subset", static_cast<double>(cfg.train_subset));
      if (*test_subset) d2l::require_positive("--test-subset", static_cast<double>(cfg.test_subset));
      concise::make_net(cfg.model, cfg.sync_bn);
      if (*seed_opt && seed < 0) throw d2l::ConfigError("bad --seed " + std::to_string(seed) + ": expected a number >= 0");
      cfg.seed = static_cast<uint64_t>(seed);
      // kvstore dist_sync under mpirun: one run, each process on --num-gpus (default 1) devices.
      const int world = concise::distributed(cfg) ? d2l::dist::world_size() : 1;
      if (d2l::dist::world_size() > 1 && world == 1)
        throw d2l::ConfigError("started as " + std::to_string(d2l::dist::world_size()) +
                               " processes by mpirun: use --kvstore dist_sync to train them together (or run one process)");
      const bool one_run = app.get_option("--num-gpus")->count() > 0 || !dev.devices.empty() || !load_params.empty() ||
                           world > 1;
      if (!one_run && (!cfg.checkpoint.empty() || !cfg.resume.empty()))
        throw d2l::ConfigError("--checkpoint and --resume follow one run: give --num-gpus or --devices");
      // The runs: the one the flags ask for, or the source's two (1 device, then 2).
      std::vector<std::vector<d2l::Device>> runs;
      if ((*demo || *lab) && !one_run) {  // the cells' two GPUs, or two emulated ones: the host holds no replica
        dev.num_gpus = 2;
        if (d2l::num_gpus() == 0 && d2l::backend_built(d2l::DeviceKind::emu)) {
          dev.devices = "emu:0,emu:1";
          std::printf("note: no GPU found; the cells run on 2 emulated GPUs [emu(0), emu(1)], so that, as in the book, "
                      "the host holds no parameters (--num-gpus 2: CPU devices)\n");
        }
      }
      if (one_run || *demo || *lab) runs.push_back(d2l::choose_devices(dev));
      else
        for (int k : {1, 2}) runs.push_back(d2l::choose_devices({k, "", dev.gemm}));
      trace.start();
      if (*demo || *lab) {
        if (*lab) cfg.model = "lab-cnn";
        if (quick) concise::make_quick(cfg);
        *demo ? concise::demo(runs[0]) : concise::lab(runs[0], cfg);
        trace.finish();
        return 0;
      }
      bool cpu_only = true;
      for (auto& r : runs) cpu_only = cpu_only && !any_gpu(r);
      const bool lab_cnn = cfg.model == "lab-cnn";
      concise::Recipe recipe = concise::recipe(cfg.model);  // the chapter's defaults (multi_gpu_concise.hpp)
      if (!quick && !full && cpu_only && !lab_cnn && !*train_subset && !*test_subset && load_params.empty()) {
        recipe = concise::kCpuSizedResNet18;
        cfg.train_subset = concise::kCpuTrainImages, cfg.test_subset = concise::kCpuTestImages;
        std::printf("no GPU: a CPU-sized version of the book's runs: ResNet-18 on the first %lld of the 60000 training "
                    "images and %lld of the 10000 test images, batch %lld and lr %g per device (the book's: %lld and %g), "
                    "%d epochs; --full runs the book's recipe (its epoch took 37 min on one CPU device here)\n",
                    (long long)cfg.train_subset, (long long)cfg.test_subset, (long long)recipe.batch_per_device,
                    recipe.lr_per_device, (long long)concise::kBookResNet18.batch_per_device,
                    concise::kBookResNet18.lr_per_device, recipe.num_epochs);
      }
      if (!one_run && cpu_only && cfg.threads.empty()) {  // one CPU device stands for one GPU in both runs (docs/thread-budget.md)
        cfg.threads = {std::max(1, d2l::num_cores() / 2)};
        std::printf("each CPU device gets %d kernel thread(s) (%d cores / 2) in both runs, so that one device stands for one GPU\n",
                    cfg.threads[0], d2l::num_cores());
      }

      // What may differ between the ranks: where each reads its data and writes its files; each
      // rank's --resume file is checked against rank 0's (harness::check_same_checkpoint).
      cfg.flags = d2l::harness::flag_fingerprint(
          app, {"--data-dir", "--plot", "--trace", "--trace-tasks", "--threads", "--save-params", "--checkpoint", "--resume"});
      const concise::Config given = cfg;  // flags given explicitly keep their values
      std::vector<concise::Result> results;
      for (auto& devices : runs) {
        concise::Config c = given;
        c.devices = devices;
        const auto k = static_cast<int64_t>(devices.size()) * world;  // devices of all processes
        c.batch_size = *batch ? given.batch_size : recipe.batch_per_device * k;
        c.lr = *lr ? given.lr : recipe.lr_scales ? recipe.lr_per_device * static_cast<float>(k) : recipe.lr_per_device;
        c.num_epochs = *epochs ? given.num_epochs : recipe.num_epochs;
        if (quick) {
          concise::make_quick(c);
          if (*batch) c.batch_size = given.batch_size;
          if (*lr) c.lr = given.lr;
          if (*epochs) c.num_epochs = given.num_epochs;
        }
        if (!load_params.empty()) {
          concise::validate(c);
          concise::SavedResult saved = concise::evaluate_saved(c, load_params);
          std::printf("test_acc %.4f: %s (--model %s) evaluated on %lld test images on %s\n", saved.accuracy, load_params.c_str(),
                      c.model.c_str(), (long long)saved.images,
                      d2l::str(c.eval_all_devices ? devices : std::vector<d2l::Device>{devices[0]}).c_str());
          return 0;
        }
        results.push_back(concise::train(c));
        d2l::waitall();  // the next run starts with empty caches: a device keeps freed blocks for reuse
        for (auto d : devices) d2l::runtime(d).allocator->empty_cache();
      }
      if (!plot.empty()) {
        std::string err = concise::plot_runs(results, plot);
        std::printf("%s\n", err.empty() ? ("plot: " + plot).c_str() : ("note: no plot: " + err).c_str());
      }
      trace.finish();
      return 0;
    } catch (const d2l::DataError& e) {  // a missing or malformed data set is bad input: exit 2
      throw d2l::ConfigError(e.what());
    }
  });
}
