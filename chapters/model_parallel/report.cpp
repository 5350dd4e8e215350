#include "chapters/model_parallel/report.hpp"

#include <algorithm>
#include <cstdio>

#include "core/ops.hpp"
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
  std::printf("devices %s: model parallel on %s, %zu pipeline stages (%s), split size %lld, sweep %s\n",
              str(cfg.devices).c_str(), str({cfg.devices[0], cfg.devices[1]}).c_str(), cfg.stages,
              pipeline::name(cfg.schedule).c_str(), (long long)cfg.split_size, sweep.c_str());
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

void trace_step(PipelineParallelResNet50& model, const Config& cfg, Result& r) {
  const int64_t B = cfg.batch_size, S = cfg.image_size, C = cfg.num_classes;
  Tensor inputs = normal({B, 3, S, S}, 0.0f, 1.0f, model.devices.front());
  Tensor labels = Tensor::zeros({B, C}, model.devices.back());
  waitall();
  trace::start();
  model.forward_backward(inputs, labels);
  waitall();
  trace::stop();
  auto events = trace::events();
  trace::write_chrome_json(cfg.trace_file, events);
  model.collect_params().zero_grad();  // a timeline, not a training step

  const size_t K = model.stages.size(), M = pipeline::micro_batches(B, model.split_size).size();
  r.bubble = pipeline::gpipe_bubble(K, M);
  auto summary = trace::summarize(events);
  r.idle.clear();
  for (auto& st : model.stages) {
    double idle = 1;
    for (auto& s : summary)
      if (s.device == st.device) idle = s.idle_fraction;
    r.idle.push_back(idle);
  }
  if (!cfg.verbose) return;
  std::printf("trace: one pipelined step (%s, K = %zu stages, M = %zu micro-batches of <= %lld), %zu stream tasks, "
              "written to %s\n", pipeline::name(model.schedule).c_str(), K, M, (long long)model.split_size,
              events.size(), cfg.trace_file.c_str());
  std::printf("idle fraction of the compute streams: %s; GPipe's bubble (K-1)/(M+K-1) = %zu/%zu = %.2f\n",
              trace::idle_line(summary).c_str(), K - 1, M + K - 1, r.bubble);
  std::fflush(stdout);
}

}  // namespace d2l::mp
