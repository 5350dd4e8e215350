#include "core/runtime.hpp"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "core/gpu/cuda_layer.hpp"
#include "core/world.hpp"
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

// ---- The GPU map (core/device.hpp "Logical GPUs"): logical gpu(i) -> physical GPU.
namespace {
std::mutex g_map_mu;
std::vector<int>& map_locked() {  // with g_map_mu held
  static std::vector<int> map = [] {
    int split = 1;
    try {
      split = parse_logical_gpus(std::getenv("D2L_LOGICAL_GPUS"));
    } catch (const ConfigError&) {  // guarded_main reports it; here the value is ignored
    }
    return split_gpus(num_physical_gpus(), split);
  }();
  return map;
}
std::map<int, int>& gpus_in_use() {  // logical -> physical of the gpu(i) runtimes created, with g_map_mu held
  static std::map<int, int> m;
  return m;
}
}  // namespace

std::string why_logical_gpus_env_is_bad() {
  try {
    parse_logical_gpus(std::getenv("D2L_LOGICAL_GPUS"));
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

std::vector<int> gpu_map() {
  std::lock_guard<std::mutex> lock(g_map_mu);
  return map_locked();
}

void set_gpu_map(std::vector<int> map) {
  std::lock_guard<std::mutex> lock(g_map_mu);
  for (auto [logical, physical] : gpus_in_use())
    if (logical >= static_cast<int>(map.size()) || map[logical] != physical)
      throw ConfigError("gpu(" + std::to_string(logical) + ") already runs on physical GPU " + std::to_string(physical) +
                        "; a process keeps one GPU map");
  map_locked() = std::move(map);
}

int num_gpus() {
  std::lock_guard<std::mutex> lock(g_map_mu);
  return static_cast<int>(map_locked().size());
}

int physical_gpu(int logical) {
  std::lock_guard<std::mutex> lock(g_map_mu);
  const auto& map = map_locked();
  if (logical < 0 || logical >= static_cast<int>(map.size()))
    throw ConfigError("no device gpu(" + std::to_string(logical) + "): this machine has " + std::to_string(map.size()) +
                      " GPU(s)");
  return map[logical];
}

// The physical GPU of a gpu(i) runtime, recorded: the map may no longer move gpu(i).
static int claim_physical_gpu(Device d) {
  if (d.kind != DeviceKind::gpu) return -1;
  const int p = physical_gpu(d.index);
  std::lock_guard<std::mutex> lock(g_map_mu);
  gpus_in_use()[d.index] = p;
  return p;
}

// A gpu(i) device's CUDA streams and cuBLAS handle, made on its physical GPU.
static GpuHandles make_gpu_handles(int physical) {
  GpuHandles h;
  if (physical < 0) return h;
  h.compute = cuda_layer::stream_create(physical);
  h.copy = cuda_layer::stream_create(physical);
  h.blas = cuda_layer::blas_create(physical, h.compute);
  return h;
}

// A gpu(i) stream's thread makes gpu(i)'s physical GPU current; its fence waits for the CUDA stream behind it.
static StreamHooks gpu_hooks(int physical, void* cuda_stream) {
  if (physical < 0) return {};
  return StreamHooks{[physical] { cuda_layer::set_device(physical); },
                     [physical, cuda_stream] { cuda_layer::stream_synchronize(physical, cuda_stream); }};
}

#ifdef D2L_WITH_CUDA
// nvcc-built launchers' scratch (cudaMallocAsync) counted on the gpu(i) whose stream queued it.
static void count_gpu_scratch(kernels::cuda::Stream stream, int64_t bytes);
[[maybe_unused]] static const bool g_scratch_hook = (kernels::cuda::set_scratch_counter(&count_gpu_scratch), true);
#endif

DeviceRuntime::DeviceRuntime(Device d)
    : pool_(d.kind == DeviceKind::gpu ? 0 : num_cores() - 1),
      physical(claim_physical_gpu(d)),
      gpu(make_gpu_handles(physical)),
      device(d),
      allocator(std::make_shared<Allocator>(d.str(), SystemMemory{physical})),
      compute(d.str() + " compute", gpu_hooks(physical, gpu.compute)),
      copy(d.str() + " copy", gpu_hooks(physical, gpu.copy)),
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
                      " GPU(s); use cpu or emu devices (e.g. --devices emu:0,emu:1), or logical GPUs "
                      "(--devices gpu:0,gpu:0 or D2L_LOGICAL_GPUS=2)");
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

static std::mutex g_comm_mu;
static std::vector<Stream*> g_comm_streams;

void add_comm_stream(Stream* s) {
  std::lock_guard<std::mutex> lock(g_comm_mu);
  g_comm_streams.push_back(s);
}

void waitall() {
  std::vector<Stream*> all;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mu);
    for (auto& [d, rt] : r.devices) all.push_back(&rt->compute), all.push_back(&rt->copy);
  }
  {
    std::lock_guard<std::mutex> lock(g_comm_mu);  // then the collectives queued on the communication streams
    all.insert(all.end(), g_comm_streams.begin(), g_comm_streams.end());
  }
  std::string first;
  for (Stream* s : all) {
    try {
      s->synchronize();
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
