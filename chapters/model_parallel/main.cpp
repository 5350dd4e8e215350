// model_parallel: "Parallel practice of ResNet model on GPU" (PyTorch's "Single-Machine Model
// Parallel Best Practices"): ToyModel, ModelParallelResNet50,
// PipelineParallelResNet50 and the section's timing experiment with its three plots (and a fourth:
// memory against micro-batches).
//   model_parallel --num-gpus 2                              (the section's experiment)
//   model_parallel --num-gpus 3 --stages 3 --balance --schedule 1f1b
//   model_parallel --quick --trace step.json                 (seconds; the timeline of one step, Perfetto)
#include <CLI/CLI.hpp>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "chapters/model_parallel/experiment.hpp"
#include "core/cli.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Model parallelism: ToyModel, ModelParallelResNet50, PipelineParallelResNet50 and their timings"};
  d2l::DeviceFlags dev;
  dev.num_gpus = 2;
  d2l::mp::Config cfg;
  std::string schedule = "gpipe", checkpoint = "never";
  bool quick = false, full = false;
  d2l::add_device_flags(app, dev);
  auto* batch = app.add_option("--batch-size", cfg.batch_size, "images per batch")->capture_default_str();
  auto* image = app.add_option("--image-size", cfg.image_size, "image height and width (>= 32)")->capture_default_str();
  auto* batches = app.add_option("--num-batches", cfg.num_batches, "batches per train(model)")->capture_default_str();
  auto* classes = app.add_option("--num-classes", cfg.num_classes, "classes (fc outputs)")->capture_default_str();
  auto* repeat = app.add_option("--repeat", cfg.repeat, "timed train(model) runs per model (timeit repeat)")->capture_default_str();
  auto* split = app.add_option("--split-size", cfg.split_size, "micro-batch size of the pipelined model")->capture_default_str();
  std::string sweep_text = "1,3,5,8,10,12,20,40,60", partition_text;
  auto* sweep = app.add_option("--sweep", sweep_text, "split sizes to time (Step 5), e.g. 1,3,5")->capture_default_str();
  app.add_option("--stages", cfg.stages, "pipeline stages: the first K devices")->capture_default_str();
  app.add_option("--schedule", schedule, "pipeline schedule: gpipe, 1f1b or zb-h1")->capture_default_str();
  app.add_option("--checkpoint", checkpoint, "recomputation: always, except_last or never (torchgpipe's names; its default is except_last)")->capture_default_str();
  auto* partition = app.add_option("--partition", partition_text, "first block of each stage among the 22 (conv1=0 .. fc=21), e.g. 0,11");
  app.add_flag("--balance", cfg.balance, "cut the stages by each block's measured time");
  app.add_option("--out-dir", cfg.out_dir, "directory of the PNGs ('' for none)")->capture_default_str();
  app.add_option("--trace", cfg.trace_file, "write one pipelined step's timeline here (Chrome-trace JSON: Perfetto)");
  int64_t seed = 0;
  app.add_option("--seed", seed, "seed of the initial parameters and the data")->capture_default_str();
  const d2l::mp::Config book;  // the section's sizes (experiment.hpp)
  d2l::mp::Config tiny;
  d2l::mp::make_quick(tiny);
  app.add_flag("--quick", quick, "tiny sizes (batch " + std::to_string(tiny.batch_size) + " of 3x" + std::to_string(tiny.image_size) + "x" +
                                     std::to_string(tiny.image_size) + ", " + std::to_string(tiny.num_classes) + " classes, " +
                                     std::to_string(tiny.num_batches) + " batch, repeat " + std::to_string(tiny.repeat) + ", sweep " +
                                     d2l::mp::sweep_text(tiny.sweep) + "): seconds");
  app.add_flag("--full", full, "the section's recipe also without a GPU (batch " + std::to_string(book.batch_size) + " of 3x" +
                                   std::to_string(book.image_size) + "x" + std::to_string(book.image_size) + ", sweep " +
                                   d2l::mp::sweep_text(book.sweep) + ")");
  d2l::harness::Conv conv;
  conv.precision.mixed = true;  // --precision bf16 / fp16: steps 3 to 5 under autocast
  conv.add_flags(app);
  d2l::install_interrupt_handlers();  // Ctrl-C / SIGTERM: stop after the current batch, exit 130 / 143
  return d2l::guarded_main(app, argc, argv, [&] {
    try {
      cfg.schedule = d2l::pipeline::parse_schedule(schedule);
    } catch (const d2l::ConfigError& e) {
      throw d2l::ConfigError(std::string("--schedule: ") + e.what());
    }
    try {
      cfg.checkpoint = d2l::pipeline::parse_checkpoint(checkpoint);
    } catch (const d2l::ConfigError& e) {
      throw d2l::ConfigError(std::string("--checkpoint: ") + e.what());
    }
    conv.apply();
    cfg.autocast = conv.precision.autocast();
    if (quick && full) throw d2l::ConfigError("--quick and --full: choose one");
    if (seed < 0) throw d2l::ConfigError("bad --seed " + std::to_string(seed) + ": expected a number >= 0");
    cfg.seed = static_cast<uint64_t>(seed);
    if (*sweep) cfg.sweep = d2l::parse_int_list("--sweep", sweep_text, /*distinct=*/true);
    if (*partition)
      for (int64_t b : d2l::parse_int_list("--partition", partition_text, false)) {
        if (b < 0) throw d2l::ConfigError("bad --partition '" + partition_text + "': block indices are >= 0");
        cfg.partition.push_back(static_cast<size_t>(b));
      }
    d2l::mp::Config given = cfg;  // flags given explicitly keep their values
    cfg.devices = d2l::choose_devices(dev);
    bool any_gpu = false;
    for (auto& d : cfg.devices) any_gpu = any_gpu || d.kind == d2l::DeviceKind::gpu;
    if (quick) {
      d2l::mp::make_quick(cfg);
    } else if (!any_gpu && !full) {
      d2l::mp::make_cpu_defaults(cfg);
    }
    if (*batch) cfg.batch_size = given.batch_size;
    if (*image) cfg.image_size = given.image_size;
    if (*batches) cfg.num_batches = given.num_batches;
    if (*classes) cfg.num_classes = given.num_classes;
    if (*repeat) cfg.repeat = given.repeat;
    if (*split) cfg.split_size = given.split_size;
    if (*sweep) cfg.sweep = given.sweep;
    if (!quick && !any_gpu && !full)
      std::printf("no GPU among %s: CPU-sized defaults (the section's in brackets; flags override): --batch-size %lld "
                  "(%lld), --image-size %lld (%lld), --repeat %d (%d), --split-size %lld (%lld), --sweep %s (%s)\n",
                  d2l::str(cfg.devices).c_str(), (long long)cfg.batch_size, (long long)book.batch_size,
                  (long long)cfg.image_size, (long long)book.image_size, cfg.repeat, book.repeat, (long long)cfg.split_size,
                  (long long)book.split_size, d2l::mp::sweep_text(cfg.sweep).c_str(), d2l::mp::sweep_text(book.sweep).c_str());
    d2l::mp::validate(cfg);  // bad sizes and an unwritable --trace fail before any work
    d2l::mp::run(cfg);
    return 0;
  });
}
