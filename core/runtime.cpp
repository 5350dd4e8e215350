#include "core/runtime.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "kernels/cpu/kernels.hpp"

namespace d2l {

int num_cores() {
  if (const char* s = std::getenv("D2L_NUM_THREADS")) {
    int n = std::atoi(s);
    if (n > 0) return n;
  }
  return std::max(1u, std::thread::hardware_concurrency());
}

DeviceRuntime::DeviceRuntime(Device d)
    : pool_(num_cores() - 1),
      device(d),
      allocator(std::make_shared<Allocator>(d.str())),
      compute(d.str() + " compute"),
      copy(d.str() + " copy"),
      threads_(num_cores()) {}

void DeviceRuntime::set_threads(int n) { threads_.store(std::clamp(n, 1, pool_.helpers() + 1)); }

namespace {
struct Registry {
  std::mutex mu;
  std::map<Device, std::unique_ptr<DeviceRuntime>> devices;
};
Registry& registry() {
  static Registry r;
  return r;
}
}  // namespace

bool backend_built(DeviceKind kind) { return kind != DeviceKind::gpu; }  // gpu(i): the CUDA runtime layer is not wired yet

DeviceRuntime& runtime(Device d) {
  if (!backend_built(d.kind))
    throw ConfigError(d.str() + ": the " + (d.kind == DeviceKind::gpu ? "CUDA" : "emulated GPU") +
                      " backend is not built in this version; use cpu devices (e.g. --devices cpu:0,cpu:1)");
  if (d.index < 0) throw ConfigError("bad device " + d.str() + ": index must be >= 0");
  kernels::cpu::check_blas();
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  auto& slot = r.devices[d];
  if (!slot) slot = std::make_unique<DeviceRuntime>(d);
  return *slot;
}

int use_devices(const std::vector<Device>& devices) {
  int cpu_like = 0;
  for (auto& d : devices) cpu_like += d.kind != DeviceKind::gpu;
  int budget = std::max(1, num_cores() / std::max(1, cpu_like));
  for (auto& d : devices)
    if (d.kind != DeviceKind::gpu) runtime(d).set_threads(budget);
  return budget;
}

void waitall() {
  std::vector<DeviceRuntime*> all;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [d, rt] : r.devices) all.push_back(rt.get());
  }
  std::string first;
  for (auto* rt : all) {
    for (Stream* s : {&rt->compute, &rt->copy}) {
      try {
        s->synchronize();
      } catch (const DeviceError& e) {
        if (first.empty()) first = e.what();
      }
    }
  }
  if (!first.empty()) throw DeviceError(first);
}

void launch(Device d, const char* op, std::vector<std::shared_ptr<Storage>> keep,
            std::function<void(const kernels::cpu::Ctx&)> fn) {
  DeviceRuntime& rt = runtime(d);
  rt.compute.enqueue(op, [&rt, keep = std::move(keep), fn = std::move(fn)] {
    fn(rt.ctx());
    rt.count_kernel();
  });
}

}  // namespace d2l
