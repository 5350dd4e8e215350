// What a device owns at run time: its compute and copy streams, its caching allocator, and, for
// CPU-backed devices, the helper threads of its thread budget. Created on first use. A gpu(i)
// device adds a CUDA stream behind each of its streams and a cuBLAS handle (core/gpu/cuda_layer.hpp):
// the stream's worker thread queues the kernels, and events complete when the GPU has run them.
#pragma once
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "core/allocator.hpp"
#include "core/device.hpp"
#include "core/stream.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace d2l {

// The CUDA handles of a gpu(i) device (all null for cpu and emu). They live until the process ends.
struct GpuHandles {
  void* compute = nullptr;  // cudaStream_t behind the compute stream
  void* copy = nullptr;     // and behind the copy stream
  void* blas = nullptr;     // cublasHandle_t on `compute`
};

// Which code runs the kernels launched on a device: kernels/cpu on cpu(i), the kernels of
// kernels/cuda compiled against the CUDA emulation on emu(i), the same kernels built by nvcc on gpu(i).
enum class Backend { cpu, emu, gpu };

// What launch() hands a kernel: its device's backend and what that backend needs. D2L_KERNEL
// (core/ops/op.hpp) dispatches on `backend`. CPU kernels get `cpu` alone (threads, helper pool,
// scratch); an emulated kernel runs over the same threads (its stream is &cpu); a gpu(i) kernel is
// queued on `cuda_stream`. The CUDA fields are null unless backend is gpu.
struct LaunchCtx {
  Backend backend = Backend::cpu;
  kernels::cpu::Ctx cpu;        // cpu and emu: the device's threads, helper pool and workspace
  void* cuda_stream = nullptr;  // gpu: the cudaStream_t its kernels are queued on
  void* blas = nullptr;         // gpu: its cuBLAS handle (bound to that stream)
};

// Kernels' scratch buffers from the device's caching allocator (counted in its figures), for the
// task running now on the device's compute stream (AllocFor::in_task).
class DeviceWorkspace final : public kernels::cpu::Workspace {
 public:
  DeviceWorkspace(Allocator& a, const Stream& s) : alloc_(a), stream_(s) {}
  void* get(size_t bytes) const override;
  void put(void* p, size_t bytes) const override;

 private:
  Allocator& alloc_;
  const Stream& stream_;
};

class DeviceRuntime {
  kernels::cpu::ThreadPool pool_;  // first: destroyed after the streams whose tasks use it

 public:
  const int physical;  // gpu(i): the physical GPU its CUDA calls use (core/device.hpp "Logical GPUs"); else -1
  const GpuHandles gpu;
  explicit DeviceRuntime(Device d);
  Device device;
  std::shared_ptr<Allocator> allocator;
  DeviceWorkspace workspace{*allocator, compute};  // before the streams: their draining tasks use it
  Stream compute, copy;

  // The threads this device's kernels may use (its budget) and what launch() hands a kernel.
  int threads() const { return threads_.load(); }
  void set_threads(int n);
  LaunchCtx ctx() {
    const Backend b = device.kind == DeviceKind::gpu ? Backend::gpu : device.kind == DeviceKind::emu ? Backend::emu : Backend::cpu;
    return LaunchCtx{b, kernels::cpu::Ctx{threads_.load(), &pool_, &workspace}, gpu.compute, gpu.blas};
  }
  // Kernels run on this device since start-up (a device "did its share").
  uint64_t kernels_run() const { return kernels_.load(); }
  void count_kernel() { kernels_.fetch_add(1); }

 private:
  std::atomic<int> threads_;
  std::atomic<uint64_t> kernels_{0};
};

// The runtime of a device; throws ConfigError for a kind whose backend is not built.
DeviceRuntime& runtime(Device d);

// Declares the devices a program computes on: each CPU-backed device (cpu, emu) gets
// max(1, cores / their count) threads. Returns the budget given.
int use_devices(const std::vector<Device>& devices);

// Cores the process may use (D2L_NUM_THREADS overrides hardware_concurrency; a value that is not a
// whole number from 1 to 1024 is ignored here and refused by the programs: why_num_threads_env_is_bad
// gives the one-line reason, or "").
std::string why_num_threads_env_is_bad();
int num_cores();
// D2L_LOGICAL_GPUS's one-line reason to refuse it (parse_logical_gpus), or "".
std::string why_logical_gpus_env_is_bad();

// Host waits until every stream of every created device is idle, and every communication stream
// added below; rethrows the first kept error.
void waitall();
// A stream that is not a device's own (the process group's MPI thread, a GPU's NCCL stream,
// core/dist) for waitall() to wait on as well; it must outlive every later waitall().
void add_comm_stream(Stream* s);

// Enqueues a kernel on d's compute stream; fn gets the device's LaunchCtx. `keep`: the storage the kernel
// touches. Storage allocated for that stream is not held (stream-ordered reuse, core/allocator.hpp:
// whatever reuses its block is queued after this kernel); any other is held until the kernel has run.
void launch(Device d, const char* op, std::vector<std::shared_ptr<Storage>> keep,
            std::function<void(const LaunchCtx&)> fn);

}  // namespace d2l
