#include "chapters/model_parallel/report.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>

#include "core/cli.hpp"
#include "core/ops.hpp"
#include "core/plot.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

namespace d2l::mp {

void print_settings(const Config& cfg) {
  std::string sweep;
  for (size_t i = 0; i < cfg.sweep.size(); ++i) sweep += (i ? "," : "") + std::to_string(cfg.sweep[i]);
  std::printf("train(model): %lld batches of %lld random 3x%lldx%lld images, one-hot labels over %lld classes, "
              "MSELoss, SGD lr 0.001; timeit repeat %d, number 1\n",
              (long long)cfg.num_batches, (long long)cfg.batch_size, (long long)cfg.image_size, (long long)cfg.image_size,
              (long long)cfg.num_classes, cfg.repeat);
  std::printf("devices %s: model parallel on %s, %zu pipeline stages (%s, --checkpoint %s), split size %lld, sweep %s\n",
              str(cfg.devices).c_str(), str({cfg.devices[0], cfg.devices[1]}).c_str(), cfg.stages,
              pipeline::name(cfg.schedule).c_str(), pipeline::name(cfg.checkpoint).c_str(), (long long)cfg.split_size,
              sweep.c_str());
  if (cfg.autocast != DType::f32)
    std::printf("mixed precision: steps 3 to 5 under autocast in %s (GEMMs and convolutions), float32 master weights%s\n",
                dtype_name(cfg.autocast), cfg.autocast == DType::f16 ? ", dynamic loss scaling" : "");
  int cpu_like = 0;
  for (auto& d : cfg.devices) cpu_like += d.kind != DeviceKind::gpu;
  if (cpu_like > 0 && cfg.devices[0].kind != DeviceKind::gpu)
    std::printf("thread budget: %d cores over %d CPU-backed devices, %d thread(s) each; 'Single GPU' runs on %s with "
                "the same %d thread(s), so each device stands for one GPU\n",
                num_cores(), cpu_like, runtime(cfg.devices[0]).threads(), cfg.devices[0].str().c_str(),
                runtime(cfg.devices[0]).threads());
  std::fflush(stdout);
}

std::vector<DeviceMemory> memory_before(const ResNet& model, const std::vector<Device>& devices) {
  std::vector<DeviceMemory> mem;
  auto params = model.collect_params();
  for (Device d : devices) {
    DeviceMemory m{d};
    for (auto& [name, p] : params) {
      auto& ctx = p->list_ctx();
      if (std::find(ctx.begin(), ctx.end(), d) != ctx.end()) m.parameters += numel(p->shape()) * 4;
    }
    auto& alloc = *runtime(d).allocator;
    alloc.reset_peak();
    m.before = alloc.stats().in_use;
    mem.push_back(m);
  }
  return mem;
}

void memory_after(std::vector<DeviceMemory>& mem) {
  for (auto& m : mem) m.peak = runtime(m.device).allocator->stats().peak;
}

void print_memory(const Result& r) {
  std::printf("memory per device (MB): parameters / in use before train() (parameters, gradients) / peak during it\n");
  auto row = [](const char* label, const std::vector<DeviceMemory>& mem) {
    std::printf("  %-26s", label);
    for (auto& m : mem)
      std::printf("  %s %.0f / %.0f / %.0f", m.device.str().c_str(), m.parameters / 1e6, m.before / 1e6, m.peak / 1e6);
    std::printf("\n");
  };
  row("Model Parallel", r.mem_mp);
  row("Single GPU", r.mem_rn);
  row("Pipelining Model Parallel", r.mem_pp);
  std::fflush(stdout);
}

void print_costs(const PipelineParallelResNet50& model, const std::vector<double>& costs) {
  auto names = model.layer_names();
  auto starts = model.partition();
  std::printf("--balance: forward + backward ms per block, stage:");
  for (size_t i = 0; i < costs.size() && i < names.size(); ++i) {
    size_t stage = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), i) - starts.begin()) - 1;
    std::printf("%s %s %.1f [%zu]", i ? "," : "", names[i].c_str(), costs[i] * 1e3, stage);
  }
  std::printf("\n");
}

std::string schedule_trace_path(const std::string& trace_file, pipeline::Schedule s) {
  const auto dot = trace_file.rfind('.'), slash = trace_file.rfind('/');
  const bool ext = dot != std::string::npos && (slash == std::string::npos || dot > slash);
  return (ext ? trace_file.substr(0, dot) : trace_file) + "." + pipeline::name(s) + (ext ? trace_file.substr(dot) : ".json");
}

void trace_step(PipelineParallelResNet50& model, const Config& cfg, Result& r) {
  const int64_t B = cfg.batch_size, S = cfg.image_size, C = cfg.num_classes;
  Tensor inputs = normal({B, 3, S, S}, 0.0f, 1.0f, model.devices.front());
  Tensor labels = Tensor::zeros({B, C}, model.devices.back());
  const size_t K = model.stages.size(), M = pipeline::micro_batches(B, model.split_size).size();
  const auto configured = model.schedule;
  std::vector<pipeline::Schedule> schedules{configured};
  for (auto s : {pipeline::Schedule::gpipe, pipeline::Schedule::one_f_one_b, pipeline::Schedule::zb_h1})
    if (s != configured) schedules.push_back(s);
  r.schedule_idle.clear();
  for (auto schedule : schedules) {
    check_interrupt();
    model.schedule = schedule;
    waitall();
    trace::start();
    {
      Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
      model.forward_backward(inputs, labels);
    }
    waitall();
    trace::stop();
    auto events = trace::events();
    const std::string path = schedule == configured ? cfg.trace_file : schedule_trace_path(cfg.trace_file, schedule);
    trace::write_chrome_json(path, events);
    model.collect_params().zero_grad();  // a timeline, not a training step

    // The formula with equal times for a forward, an input gradient and a weight gradient.
    const double formula = pipeline::bubble_fraction(schedule, K, M, 1, 1, 1);
    auto summary = trace::summarize(events);
    std::vector<double> idle;
    for (auto& st : model.stages) {
      double x = 1;
      for (auto& s : summary)
        if (s.device == st.device) x = s.idle_fraction;
      idle.push_back(x);
    }
    r.schedule_idle.push_back({schedule, idle, formula});
    if (schedule == configured) r.idle = idle, r.bubble = formula;
    if (!cfg.verbose) continue;
    std::printf("trace: one pipelined step (%s, K = %zu stages, M = %zu micro-batches of <= %lld), %zu stream tasks, "
                "written to %s\n", pipeline::name(schedule).c_str(), K, M, (long long)model.split_size, events.size(),
                path.c_str());
    if (schedule == pipeline::Schedule::zb_h1)
      std::printf("  idle fraction of the compute streams: %s; zb-h1's bubble (K-1)(T_F+T_B-T_W) / (M(T_F+T_B+T_W) + "
                  "(K-1)(T_F+T_B-T_W)) with T_F = T_B = T_W: (K-1)/(3M+K-1) = %zu/%zu = %.2f\n",
                  trace::idle_line(summary).c_str(), K - 1, 3 * M + K - 1, formula);
    else
      std::printf("  idle fraction of the compute streams: %s; %s's bubble (K-1)/(M+K-1) = %zu/%zu = %.2f\n",
                  trace::idle_line(summary).c_str(), schedule == pipeline::Schedule::gpipe ? "GPipe" : "1f1b",
                  K - 1, M + K - 1, formula);
    std::fflush(stdout);
  }
  model.schedule = configured;
}

std::vector<Result::MemoryPoint> memory_vs_microbatches(PipelineParallelResNet50& model, const Config& cfg, int64_t micro,
                                                        const std::vector<size_t>& Ms,
                                                        const std::vector<std::pair<pipeline::Schedule, pipeline::Checkpoint>>& runs) {
  const int64_t S = cfg.image_size, C = cfg.num_classes;
  const auto saved_split = model.split_size;
  const auto saved_schedule = model.schedule;
  const auto saved_checkpoint = model.checkpoint;
  model.split_size = micro;
  auto step = [&](size_t M) {
    const int64_t B = static_cast<int64_t>(M) * micro;
    Tensor inputs = normal({B, 3, S, S}, 0.0f, 1.0f, model.devices.front());
    Tensor labels = Tensor::zeros({B, C}, model.devices.back());
    waitall();
    std::vector<int64_t> before;
    for (auto& st : model.stages) {
      auto& alloc = *runtime(st.device).allocator;
      alloc.reset_peak();
      before.push_back(alloc.stats().in_use);
    }
    const auto t0 = std::chrono::steady_clock::now();
    {
      Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
      model.forward_backward(inputs, labels);
    }
    waitall();
    Result::MemoryPoint p{model.schedule, model.checkpoint, M, {}, 0};
    p.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t s = 0; s < model.stages.size(); ++s)
      p.peak.push_back(runtime(model.stages[s].device).allocator->stats().peak - before[s]);
    return p;
  };
  std::vector<Result::MemoryPoint> out;
  model.schedule = pipeline::Schedule::gpipe, model.checkpoint = pipeline::Checkpoint::never;
  step(1);  // the gradients exist from here on: every measured step starts with them in use
  for (auto& [schedule, checkpoint] : runs)
    for (size_t M : Ms) {
      check_interrupt();
      model.schedule = schedule, model.checkpoint = checkpoint;
      out.push_back(step(M));
    }
  model.split_size = saved_split, model.schedule = saved_schedule, model.checkpoint = saved_checkpoint;
  model.collect_params().zero_grad();  // measurements, not training steps
  return out;
}

static std::string run_name(pipeline::Schedule s, pipeline::Checkpoint c) {
  return pipeline::name(s) + (c == pipeline::Checkpoint::never ? "" : " --checkpoint " + pipeline::name(c));
}

std::string report_memory(const std::vector<Result::MemoryPoint>& points, const PipelineParallelResNet50& model,
                          const Config& cfg, int64_t micro) {
  if (points.empty()) return "";
  if (cfg.verbose) {
    std::printf("peak activation memory of one training step per stage device (MB above what was in use before: "
                "parameters, gradients, the batch), M micro-batches of %lld images of 3x%lldx%lld; seconds per step\n",
                (long long)micro, (long long)cfg.image_size, (long long)cfg.image_size);
    for (auto& p : points) {
      std::printf("  %-28s M = %2zu:", run_name(p.schedule, p.checkpoint).c_str(), p.M);
      for (size_t s = 0; s < p.peak.size(); ++s)
        std::printf("  %s %7.1f", model.stages[s].device.str().c_str(), p.peak[s] / 1e6);
      std::printf("   %6.2f s\n", p.seconds);
    }
    std::fflush(stdout);
  }
  if (cfg.out_dir.empty()) return "";
  std::vector<Series> series;
  for (auto& p : points) {
    for (size_t s = 0; s < p.peak.size(); ++s) {
      const std::string name = run_name(p.schedule, p.checkpoint) + ", stage " + std::to_string(s) + " (" +
                               model.stages[s].device.str() + ")";
      auto it = std::find_if(series.begin(), series.end(), [&](const Series& x) { return x.name == name; });
      if (it == series.end()) series.push_back({name, {}, {}, {}}), it = series.end() - 1;
      it->x.push_back(static_cast<double>(p.M));
      it->y.push_back(p.peak[s] / 1e6);
    }
  }
  PlotSpec spec{"peak activation memory of one step, micro-batches of " + std::to_string(micro) + " images of 3x" +
                    std::to_string(cfg.image_size) + "x" + std::to_string(cfg.image_size),
                "micro-batches M", "MB above parameters and gradients", series};
  spec.key = "top left font ',8'";
  return plot_png(spec, cfg.out_dir + "/memory_vs_microbatches.png");
}

}  // namespace d2l::mp
