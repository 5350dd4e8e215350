// Fibers: the emulated CUDA threads of one block, run cooperatively on one OS thread.
// A fiber runs fn(arg) on its own stack until it calls Fiber::yield() (a barrier) or returns;
// the OS thread's scheduler (BlockRunner, block.cpp) resumes it. Fibers never move between OS
// threads, so thread_local state (threadIdx, the block's shared memory) is safe to use in them.
//
// Switching: on x86-64 a 16-instruction switch of the callee-saved registers (a few ns); elsewhere,
// or built with -DD2L_EMU_UCONTEXT (the tests build both), ucontext's swapcontext (~100-250 ns:
// it makes a sigprocmask system call).
// Sanitizers: every switch tells ASan (__sanitizer_start/finish_switch_fiber) and TSan
// (__tsan_switch_to_fiber) about the new stack, so both keep working inside kernels.
#pragma once
#include <cstddef>
#include <memory>

#include "kernels/cpu/no_copy.hpp"

namespace d2l::cuda_emu {

class Fiber : NoCopy {
 public:
  // stack_bytes: usable stack; a PROT_NONE guard page below it turns an overflow into a crash.
  explicit Fiber(size_t stack_bytes);
  ~Fiber();

  // Prepares the fiber to run fn(arg) from the start at the next resume(). The fiber must be
  // finished (or never started). fn must not throw: catch inside it.
  void start(void (*fn)(void*), void* arg);
  // Scheduler -> fiber: runs it until it yields or returns. Called from outside any fiber.
  void resume();
  bool finished() const { return finished_; }

  // Fiber -> scheduler: called by the running fiber; returns when the scheduler resumes it.
  static void yield();
  // True while the calling code runs inside a fiber (kernel code), false on a plain OS thread.
  static bool inside();

  struct Impl;  // the switch mechanism and sanitizer state (fiber.cpp)

 private:
  std::unique_ptr<Impl> impl_;
  bool finished_ = true;
};

// Default stack for kernel threads: kernels keep small locals (a register tile of 8x8 floats is
// 256 bytes), but sanitizers grow frames several times, so they get more. Memory is reserved,
// not committed: 1024 threads x 256 KiB is 256 MiB of address space, a few MiB touched.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
inline constexpr size_t kFiberStackBytes = 256 * 1024;
#else
inline constexpr size_t kFiberStackBytes = 64 * 1024;
#endif

}  // namespace d2l::cuda_emu
