#include "core/runtime.hpp"

#include "core/dist/process_group.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/gpu/cuda_layer.hpp"
#include "kernels/cpu/kernels.hpp"
#ifdef D2L_WITH_CUDA
#include "kernels/cuda/gpu.hpp"
#endif

namespace d2l {

std::string why_num_threads_env_is_bad() {
  const char* s = std::getenv("D2L_NUM_THREADS");
  if (!s) return "";
  const std::string text(s);
  bool digits = !text.empty() && text.size() <= 5 && text.find_first_not_of("0123456789") == std::string::npos;
  int n = digits ? std::stoi(text) : 0;
  if (n >= 1 && n <= 1024) return "";
  return "bad D2L_NUM_THREADS '" + text.substr(0, 40) + "': expected a whole number of threads from 1 to 1024 (or unset it)";
}

int num_cores() {
  if (const char* s = std::getenv("D2L_NUM_THREADS"); s && why_num_threads_env_is_bad().empty()) return std::atoi(s);
  // Processes launched together on one host (mpirun) share its cores.
  return std::max(1, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())) / dist::world().local_size);
}

static GpuHandles make_gpu_handles(Device d) {
  GpuHandles h;
  if (d.kind != DeviceKind::gpu) return h;
  h.compute = cuda_layer::stream_create(d.index);
  h.copy = cuda_layer::stream_create(d.index);
  h.blas = cuda_layer::blas_create(d.index, h.compute);
  return h;
}

// A gpu(i) stream's thread makes GPU i current; its fence waits for the CUDA stream behind it.
static StreamHooks gpu_hooks(Device d, void* cuda_stream) {
  if (d.kind != DeviceKind::gpu) return {};
  int i = d.index;
  return StreamHooks{[i] { cuda_layer::set_device(i); },
                     [i, cuda_stream] { cuda_layer::stream_synchronize(i, cuda_stream); }};
}

#ifdef D2L_WITH_CUDA
// nvcc-built launchers' scratch (cudaMallocAsync) counted on the gpu(i) whose stream queued it.
static void count_gpu_scratch(kernels::cuda::Stream stream, int64_t bytes);
[[maybe_unused]] static const bool g_scratch_hook = (kernels::cuda::set_scratch_counter(&count_gpu_scratch), true);
#endif

DeviceRuntime::DeviceRuntime(Device d)
    : pool_(d.kind == DeviceKind::gpu ? 0 : num_cores() - 1),
      gpu(make_gpu_handles(d)),
      device(d),
      allocator(std::make_shared<Allocator>(d.str(), SystemMemory{d.kind == DeviceKind::gpu ? d.index : -1})),
      compute(d.str() + " compute", gpu_hooks(d, gpu.compute)),
      copy(d.str() + " copy", gpu_hooks(d, gpu.copy)),
      threads_(d.kind == DeviceKind::gpu ? 1 : num_cores()) {}

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

#ifdef D2L_WITH_CUDA
static void count_gpu_scratch(kernels::cuda::Stream stream, int64_t bytes) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  for (auto& [d, rt] : r.devices)
    if (rt->gpu.compute == static_cast<void*>(stream) || rt->gpu.copy == static_cast<void*>(stream))
      return rt->allocator->count(bytes);
}
#endif

bool backend_built(DeviceKind kind) { return kind != DeviceKind::gpu || built_with_cuda(); }

DeviceRuntime& runtime(Device d) {
  if (!backend_built(d.kind))
    throw ConfigError(d.str() + ": the CUDA backend is not built (nvcc was not found when the project was "
                      "configured); use cpu or emu devices (e.g. --devices emu:0,emu:1)");
  if (d.index < 0) throw ConfigError("bad device " + d.str() + ": index must be >= 0");
  if (d.kind == DeviceKind::gpu && d.index >= num_gpus())
    throw ConfigError("no device " + d.str() + ": this machine has " + std::to_string(num_gpus()) +
                      " GPU(s); use cpu or emu devices (e.g. --devices emu:0,emu:1)");
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
  if (dist::initialized()) {  // the collectives queued on the communication streams
    try {
      dist::synchronize();
    } catch (const DeviceError& e) {
      if (first.empty()) first = e.what();
    }
  }
  if (!first.empty()) throw DeviceError(first);
  if (work_cancelled()) throw WorkCancelled();  // what the host reads next may never have been computed
}

void* DeviceWorkspace::get(size_t bytes) const { return alloc_.allocate(bytes, {stream_.clock().get(), true}); }

// The scratch was the running task's alone: on a CPU-backed device that task is done with it now;
// on a gpu(i) device once the kernels it queued have run.
void DeviceWorkspace::put(void* p, size_t bytes) const {
  const auto& clock = stream_.clock();
  const bool queued_kernels = stream_.has_fence();
  alloc_.deallocate(p, bytes, {StreamPoint{clock, clock->run.load(std::memory_order_acquire) + (queued_kernels ? 1 : 0)}});
}

void launch(Device d, const char* op, std::vector<std::shared_ptr<Storage>> keep,
            std::function<void(const LaunchCtx&)> fn) {
  DeviceRuntime& rt = runtime(d);
  std::erase_if(keep, [&](const std::shared_ptr<Storage>& s) { return s->home == rt.compute.clock(); });
  rt.compute.enqueue(op, [&rt, keep = std::move(keep), fn = std::move(fn)] {
    fn(rt.ctx());
    rt.count_kernel();
  });
}

}  // namespace d2l
