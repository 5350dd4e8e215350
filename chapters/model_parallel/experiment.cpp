// Steps 3-5 of the section: train(model), timeit.repeat, the three plots, the best split size; beyond the section, memory against micro-batches (a fourth plot).
#include "chapters/model_parallel/experiment.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <memory>
#include <unistd.h>

#include "chapters/model_parallel/report.hpp"
#include "core/cli.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"
#include "core/plot.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

namespace d2l::mp {

void make_cpu_defaults(Config& cfg) {
  cfg.batch_size = 32;
  cfg.image_size = 64;
  cfg.repeat = 5;
  cfg.split_size = 16;
  cfg.sweep = {1, 2, 4, 8, 16};
}

void make_quick(Config& cfg) {
  cfg.batch_size = 8, cfg.image_size = 32, cfg.num_classes = 10, cfg.num_batches = 1, cfg.repeat = 2;
  cfg.split_size = 4, cfg.sweep = {2, 4, 8};
}

std::string sweep_text(const std::vector<int64_t>& sweep) {
  std::string s;
  for (size_t i = 0; i < sweep.size(); ++i) s += (i ? "," : "") + std::to_string(sweep[i]);
  return s;
}

bool fits_batch_norm(const Config& cfg, int64_t split_size) {
  if (cfg.image_size > 32) return true;  // layer4's output is at least 2x2
  return split_size >= 2 && cfg.batch_size % split_size != 1;
}

void validate(const Config& cfg) {
  auto at_least = [](const char* flag, int64_t v, int64_t lo) {
    if (v < lo) throw ConfigError("bad " + std::string(flag) + " " + std::to_string(v) + ": expected a number >= " + std::to_string(lo));
  };
  at_least("--batch-size", cfg.batch_size, 1);
  at_least("--num-batches", cfg.num_batches, 1);
  at_least("--num-classes", cfg.num_classes, 1);
  at_least("--repeat", cfg.repeat, 1);
  // 32 is the smallest input the five halvings of ResNet-50 (stem, max pool, layer2..4) leave >= 1x1.
  at_least("--image-size", cfg.image_size, 32);
  // Memory: autograd keeps every activation of a training step, about 8 KB per input pixel per image
  // (measured: 1.0 GB at batch 32 of 64x64), plus the parameters, gradients and update (0.5 GB).
  // Each size flag is checked alone first (the others at their smallest), so the error names the
  // one that is too big; then together.
  auto step_bytes = [](double batch, double side) { return 8e3 * batch * side * side + 0.5e9; };
  const double batch = double(cfg.batch_size), side = double(cfg.image_size), classes = double(cfg.num_classes);
  require_memory("--image-size", side, step_bytes(1, side));
  require_memory("--batch-size", batch, step_bytes(batch, 32));
  require_memory_of("--batch-size " + std::to_string(cfg.batch_size) + " with --image-size " + std::to_string(cfg.image_size),
                    step_bytes(batch, side));
  // fc: 2048 x classes weights with their gradient, momentum and update, and one-hot labels.
  require_memory("--num-classes", classes, 4.0 * 4 * 2048 * classes + 3.0 * 4 * batch * classes);
  at_least("--split-size", cfg.split_size, 1);
  if (cfg.split_size > cfg.batch_size)
    throw ConfigError("bad --split-size " + std::to_string(cfg.split_size) + ": larger than --batch-size " +
                      std::to_string(cfg.batch_size) + " (a micro-batch is at most the whole batch)");
  if (!fits_batch_norm(cfg, cfg.split_size))
    throw ConfigError("bad --split-size " + std::to_string(cfg.split_size) + " for --batch-size " +
                      std::to_string(cfg.batch_size) + " and --image-size " + std::to_string(cfg.image_size) +
                      ": layer4's output is 1x1, so BatchNorm needs micro-batches of at least 2 images "
                      "(or use --image-size 33 or more)");
  for (int64_t s : cfg.sweep) at_least("--sweep value", s, 1);
  if (cfg.devices.size() < 2)
    throw ConfigError("model parallelism needs at least 2 devices, got " + str(cfg.devices) + " (--num-gpus 2 or --devices)");
  if (cfg.stages < 2 || cfg.stages > cfg.devices.size())
    throw ConfigError("bad --stages " + std::to_string(cfg.stages) + ": expected 2 up to the number of devices, " +
                      std::to_string(cfg.devices.size()) + " (" + str(cfg.devices) + ")");
  if (!cfg.partition.empty()) {
    bool ok = cfg.partition.size() == cfg.stages && cfg.partition[0] == 0;
    for (size_t s = 1; ok && s < cfg.partition.size(); ++s)
      ok = cfg.partition[s] > cfg.partition[s - 1] && cfg.partition[s] < 22;
    std::string given;
    for (size_t s = 0; s < cfg.partition.size(); ++s) given += (s ? "," : "") + std::to_string(cfg.partition[s]);
    if (!ok)
      throw ConfigError("bad --partition '" + given + "': expected " + std::to_string(cfg.stages) +
                        " increasing block indices (one per stage of --stages) starting at 0 and below 22");
  }
  if (!cfg.trace_file.empty()) {
    trace::check_writable(cfg.trace_file);
    for (auto sched : {pipeline::Schedule::gpipe, pipeline::Schedule::one_f_one_b, pipeline::Schedule::zb_h1})
      if (sched != cfg.schedule) trace::check_writable(schedule_trace_path(cfg.trace_file, sched));
  }
  std::vector<std::string> pngs{"mp_vs_rn.png", "mp_vs_rn_vs_pp.png", "split_size_tradeoff.png"};
  if (cfg.memory_sweep) pngs.push_back("memory_vs_microbatches.png");
  check_output_dir("--out-dir", cfg.out_dir, pngs);  // every PNG's place proven writable before any work
}

namespace {
// one_hot_indices = torch.LongTensor(batch_size).random_(0, num_classes), then
// labels = torch.zeros(batch_size, num_classes).scatter_(1, one_hot_indices, 1), in host memory.
std::vector<float> one_hot_labels(int64_t batch_size, int64_t num_classes, Device d) {
  std::vector<float> u = uniform({batch_size}, 0.0f, static_cast<float>(num_classes), d).to_vector();
  std::vector<float> labels(static_cast<size_t>(batch_size * num_classes), 0.0f);
  for (int64_t i = 0; i < batch_size; ++i) {
    int64_t k = std::min(num_classes - 1, static_cast<int64_t>(u[static_cast<size_t>(i)]));
    labels[static_cast<size_t>(i * num_classes + k)] = 1.0f;
  }
  return labels;
}

std::vector<Device> first(const std::vector<Device>& d, size_t n) { return {d.begin(), d.begin() + static_cast<long>(n)}; }
}  // namespace

void train(ResNet& model, Device input_device, const Config& cfg) {
  // model.train(True) is the default mode; loss_fn = nn.MSELoss(): mse(); optim.SGD(lr=0.001).
  optim::Trainer optimizer(model.collect_params(), "sgd", {.learning_rate = 0.001f});
  optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
  const int64_t B = cfg.batch_size, C = cfg.num_classes, S = cfg.image_size;
  const std::vector<float> labels_host = one_hot_labels(B, C, input_device);
  auto* pipelined = dynamic_cast<PipelineParallelResNet50*>(&model);
  for (int64_t b = 0; b < cfg.num_batches; ++b) {
    check_interrupt();  // Ctrl-C / SIGTERM: stop between batches (main() exits 130 / 143)
    Tensor inputs = normal({B, 3, S, S}, 0.0f, 1.0f, input_device);  // torch.randn(batch_size, 3, image_w, image_h)
    // optimizer.zero_grad(): the Trainer zeroes every gradient after its step, so they are zero here.
    {
      // --precision bf16 / fp16: the forward and backward under autocast (f32: off), the step after
      // it (the scope's 16-bit weight copies go with it)
      Autocast mixed(cfg.autocast);
      if (pipelined) {
        // The pipelined model's forward and backward are one schedule; the labels go to the last stage.
        pipelined->forward_backward(inputs, Tensor::from_vector(labels_host, {B, C}, pipelined->stages.back().device), scaler);
      } else {
        Tensor outputs = model(inputs);
        Tensor labels = Tensor::from_vector(labels_host, {B, C}, outputs.device());  // labels.to(outputs.device)
        scaler.scale(mse(outputs, labels)).backward();
      }
    }
    scaler.step(optimizer, 1);  // optimizer.step(): SGD on the mean loss, no division by a batch size
    scaler.update();
    // loss.item() in spirit: the host waits for each batch, so a timed train() is exactly its batches.
    waitall();
  }
}

Timing time_train(ResNet& model, Device input_device, const Config& cfg) {
  Timing t;
  for (int r = 0; r < cfg.repeat; ++r) {
    auto start = std::chrono::steady_clock::now();
    train(model, input_device, cfg);
    t.runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  for (double x : t.runs) t.mean += x / static_cast<double>(t.runs.size());
  for (double x : t.runs) t.std += (x - t.mean) * (x - t.mean) / static_cast<double>(t.runs.size());
  t.std = std::sqrt(t.std);
  return t;
}

namespace {
// Times a model and records what each of `devices` held meanwhile.
Timing timed(ResNet& model, Device input_device, const std::vector<Device>& devices, const Config& cfg,
             std::vector<DeviceMemory>& mem) {
  waitall();
  mem = memory_before(model, devices);
  Timing t = time_train(model, input_device, cfg);
  memory_after(mem);
  return t;
}

void print_timing(const char* label, const Timing& t) {
  std::printf("%-26s %.3f s +- %.3f (mean +- std of %zu runs)\n", label, t.mean, t.std, t.runs.size());
  std::fflush(stdout);
}

void draw(Result& r, const Config& cfg, const std::string& name, const std::string& err) {
  std::string path = cfg.out_dir + "/" + name;
  if (err.empty()) r.plots.push_back(path);
  if (cfg.verbose) std::printf("%s\n", err.empty() ? ("plot: " + path).c_str() : ("note: " + err).c_str());
}

// The section's plot(means, stds, labels, fig_name): bars with the standard deviation as error bars.
std::string bars(const Config& cfg, const std::vector<const Timing*>& t, const std::vector<std::string>& labels,
                 const std::string& name) {
  BarSpec spec{"train(model): " + std::to_string(cfg.num_batches) + " batches of " + std::to_string(cfg.batch_size) +
                   " 3x" + std::to_string(cfg.image_size) + "x" + std::to_string(cfg.image_size) + " on " +
                   str(first(cfg.devices, 2)),
               "ResNet50 Execution Time (Second)", labels, {}, {}};
  for (auto* x : t) spec.means.push_back(x->mean), spec.errors.push_back(x->std);
  return bar_png(spec, cfg.out_dir + "/" + name);
}
}  // namespace

Result run(const Config& cfg) {
  validate(cfg);
  Result r;
  const Device dev0 = cfg.devices[0], dev1 = cfg.devices[1];
  const auto pipe_devices = first(cfg.devices, cfg.stages);
  if (cfg.verbose) print_settings(cfg);

  // Step 1: the toy model, one step.
  toy_step(dev0, dev1, cfg.verbose);

  // Step 3: setup = "model = ModelParallelResNet50()", then the single-device ResNet-50 on dev0.
  {
    manual_seed(cfg.seed);
    ModelParallelResNet50 model(dev0, dev1, cfg.num_classes);
    r.mp = timed(model, dev0, {dev0, dev1}, cfg, r.mem_mp);
  }
  if (cfg.verbose) print_timing("Model Parallel:", r.mp);
  {
    manual_seed(cfg.seed);
    auto model = resnet50(cfg.num_classes);
    model->to(dev0);
    r.rn = timed(*model, dev0, {dev0}, cfg, r.mem_rn);
  }
  if (cfg.verbose) print_timing("Single GPU:", r.rn);
  if (!cfg.out_dir.empty())
    draw(r, cfg, "mp_vs_rn.png", bars(cfg, {&r.mp, &r.rn}, {"Model Parallel", "Single GPU"}, "mp_vs_rn.png"));

  // Step 4: setup = "model = PipelineParallelResNet50()".
  manual_seed(cfg.seed);
  PipelineParallelResNet50 pp(cfg.split_size, pipe_devices, cfg.schedule, cfg.partition, cfg.num_classes);
  pp.checkpoint = cfg.checkpoint;
  if (cfg.balance) {
    // A micro-batch's worth of images: the blocks' costs at the size the stages will see.
    Tensor sample = normal({cfg.split_size, 3, cfg.image_size, cfg.image_size}, 0.0f, 1.0f, dev0);
    std::vector<double> costs;
    pp.set_partition(balanced_partition(pp, sample, dev0, cfg.stages, &costs));
    if (cfg.verbose) print_costs(pp, costs);
  }
  r.partition = pp.partition_str();
  if (cfg.verbose) std::printf("pipeline (%s, --checkpoint %s, split size %lld): %s\n", pipeline::name(cfg.schedule).c_str(),
                               pipeline::name(cfg.checkpoint).c_str(), (long long)cfg.split_size, r.partition.c_str());
  r.pp = timed(pp, dev0, pipe_devices, cfg, r.mem_pp);
  if (cfg.verbose) print_timing("Pipelining Model Parallel:", r.pp);
  if (!cfg.out_dir.empty())
    draw(r, cfg, "mp_vs_rn_vs_pp.png",
         bars(cfg, {&r.mp, &r.rn, &r.pp}, {"Model Parallel", "Single GPU", "Pipelining Model Parallel"}, "mp_vs_rn_vs_pp.png"));
  if (cfg.verbose) print_memory(r);

  // The timeline of one pipelined step, and each device's idle time against GPipe's bubble.
  if (!cfg.trace_file.empty()) trace_step(pp, cfg, r);

  // What each schedule holds: peak activation memory against the number of micro-batches.
  if (cfg.memory_sweep) {
    const int64_t micro = 2;  // images per micro-batch: M of them in flight show the schedules apart
    using pipeline::Checkpoint;
    using pipeline::Schedule;
    const std::vector<size_t> Ms = cfg.image_size <= 32 ? std::vector<size_t>{1, 2, 4, 8} : std::vector<size_t>{1, 2, 4, 8, 16};
    r.memory = memory_vs_microbatches(pp, cfg, micro, Ms,
                                      {{Schedule::gpipe, Checkpoint::never}, {Schedule::one_f_one_b, Checkpoint::never},
                                       {Schedule::zb_h1, Checkpoint::never}, {Schedule::gpipe, Checkpoint::always},
                                       {Schedule::one_f_one_b, Checkpoint::always}});
    const std::string err = report_memory(r.memory, pp, cfg, micro);
    if (!cfg.out_dir.empty()) draw(r, cfg, "memory_vs_microbatches.png", err);
  }

  // Step 5: the split-size sweep (one model; its split size changes between points), ending with
  // split size = batch size: one micro-batch, no pipelining (the right arm of the U).
  std::vector<int64_t> sweep = cfg.sweep;
  if (std::find(sweep.begin(), sweep.end(), cfg.batch_size) == sweep.end()) sweep.push_back(cfg.batch_size);
  for (int64_t s : sweep) {
    if (s > cfg.batch_size || !fits_batch_norm(cfg, s)) {
      if (cfg.verbose)
        std::printf("split size %lld: skipped, %s\n", (long long)s,
                    s > cfg.batch_size ? "larger than the batch" : "a micro-batch of 1 image meets BatchNorm on 1x1 maps");
      continue;
    }
    pp.split_size = s;
    r.sweep.push_back(s);
    r.sweep_times.push_back(time_train(pp, dev0, cfg));
    if (cfg.verbose) {
      std::string label = "split size " + std::to_string(s) + (s == cfg.batch_size ? " (no pipelining):" : ":");
      print_timing(label.c_str(), r.sweep_times.back());
    }
  }
  if (!r.sweep.empty()) {
    size_t best = 0;
    for (size_t i = 1; i < r.sweep.size(); ++i)
      if (r.sweep_times[i].mean < r.sweep_times[best].mean) best = i;
    r.best_split = r.sweep[best];
    if (cfg.verbose) std::printf("best split size: %lld (%.3f s)\n", (long long)r.best_split, r.sweep_times[best].mean);
    if (!cfg.out_dir.empty()) {
      Series s{"mean of the runs (error bars: std)", {}, {}, {}};
      for (size_t i = 0; i < r.sweep.size(); ++i) {
        s.x.push_back(static_cast<double>(r.sweep[i]));
        s.y.push_back(r.sweep_times[i].mean);
        s.yerr.push_back(r.sweep_times[i].std);
      }
      PlotSpec spec{"PipelineParallelResNet50 (" + pipeline::name(cfg.schedule) + ") on " + str(pipe_devices) +
                        ", batch " + std::to_string(cfg.batch_size),
                    "Pipeline Split Size", "ResNet50 Execution Time (Second)", {s}};
      draw(r, cfg, "split_size_tradeoff.png", plot_png(spec, cfg.out_dir + "/split_size_tradeoff.png"));
    }
  }
  return r;
}

}  // namespace d2l::mp
