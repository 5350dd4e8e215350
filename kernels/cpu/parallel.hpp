// The threads a CPU kernel may use: the device's thread budget (DESIGN.md "Thread budget").
// A kernel receives a Ctx and splits its outer loop with parallel_for; chunk 0 runs on the calling
// thread (the device's compute stream), the other chunks on the device's helper threads.
#pragma once
#include <cstdint>
#include <functional>

namespace d2l::kernels::cpu {

class ThreadPool;  // core/thread_pool.hpp

struct Ctx {
  int threads = 1;             // the device's budget; 1 means "run inline"
  ThreadPool* pool = nullptr;  // helper threads (threads - 1 of them), or null
  bool emulated = false;       // an emu(i) device: core runs the kernels/cuda kernels, emulated
  void* cuda_stream = nullptr; // a gpu(i) device: the cudaStream_t its kernels are queued on
  void* blas = nullptr;        // and its cuBLAS handle (bound to that stream)

  // Calls fn(begin, end) on disjoint ranges covering [0, n), at most `threads` at a time.
  // Ranges are contiguous and their bounds depend only on n and threads.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const;
};

// A Ctx that runs everything on the calling thread (tests, references).
inline Ctx serial_ctx() { return Ctx{}; }

}  // namespace d2l::kernels::cpu
