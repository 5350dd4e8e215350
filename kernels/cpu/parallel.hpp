// The threads a CPU kernel may use: the device's thread budget (docs/thread-budget.md).
// A kernel receives a Ctx and splits its outer loop with parallel_for; chunk 0 runs on the calling
// thread (the device's compute stream), the other chunks on the device's helper threads.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "kernels/cpu/no_copy.hpp"

namespace d2l::kernels::cpu {

class ThreadPool;  // kernels/cpu/thread_pool.hpp

// Where a kernel's scratch buffers come from: the device's caching allocator, so they count in its
// bytes in use and peak like any tensor (core/runtime.cpp). Without one (tests, references), the heap.
struct Workspace {
  virtual void* get(size_t bytes) const = 0;
  virtual void put(void* p, size_t bytes) const = 0;
};

struct Ctx {
  int threads = 1;             // the device's budget; 1 means "run inline"
  ThreadPool* pool = nullptr;  // helper threads (threads - 1 of them), or null
  const Workspace* workspace = nullptr;  // scratch memory (null: the heap)

  // Calls fn(begin, end) on disjoint ranges covering [0, n), at most `threads` at a time.
  // Ranges are contiguous and their bounds depend only on n and threads.
  void parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const;
};

// A Ctx that runs everything on the calling thread (tests, references).
inline Ctx serial_ctx() { return Ctx{}; }

// n values of scratch for the kernel running now, from `ws` (or the heap), returned when it goes.
template <class T>
class Scratch : NoCopy {
 public:
  Scratch(const Workspace* ws, int64_t n) : ws_(ws), bytes_(static_cast<size_t>(n > 0 ? n : 0) * sizeof(T)) {
    if (bytes_ == 0) return;  // nothing to hold (data() is null)
    if (ws_) p_ = static_cast<T*>(ws_->get(bytes_));
    else heap_.resize(static_cast<size_t>(n)), p_ = heap_.data();
  }
  ~Scratch() {
    if (ws_ && p_) ws_->put(p_, bytes_);
  }
  T* data() const { return p_; }

 private:
  const Workspace* ws_;
  size_t bytes_;
  T* p_ = nullptr;
  std::vector<T> heap_;
};

}  // namespace d2l::kernels::cpu
