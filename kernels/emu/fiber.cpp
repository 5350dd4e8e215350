// Fiber switching (see fiber.hpp). Two mechanisms behind one small Impl:
//   x86-64: d2l_emu_switch below pushes the callee-saved registers on the old stack, stores its
//           stack pointer, loads the other one and pops them from there;
//   other:  ucontext's swapcontext.
// Around every switch the sanitizer hooks run in the order their documentation asks for:
// ASan start_switch before / finish_switch after, TSan switch_to_fiber right before.
#include "kernels/emu/fiber.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#if defined(__x86_64__) && !defined(D2L_EMU_UCONTEXT)
#define D2L_EMU_ASM_SWITCH 1
#else
#include <ucontext.h>
#endif
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif
#ifdef __SANITIZE_THREAD__
#include <sanitizer/tsan_interface.h>
#endif

#ifdef D2L_EMU_ASM_SWITCH
// void d2l_emu_switch(void** save_sp, void* to_sp)   (System V: rdi = save_sp, rsi = to_sp)
// Saved frame, from the stack pointer up: r15 r14 r13 r12 rbx rbp return-address. The FP control
// words (MXCSR, x87 CW) are not switched (ldmxcsr/fldcw are slow): every fiber of an OS thread
// shares that thread's, and nothing here changes them; a fiber starts with the thread's values.
// It returns by pop + jmp, not ret: the return-stack predictor is always wrong across a stack
// switch, while the indirect-jump predictor learns the usual target (half the cost measured here).
// d2l_emu_trampoline is where a new fiber "returns" to: it calls r13(r12) = Impl::entry(impl);
// its CFI marks the return address undefined so unwinders stop at the fiber's first frame.
asm(R"(
  .text
  .p2align 4
  .globl d2l_emu_switch
  .hidden d2l_emu_switch
  .type d2l_emu_switch, @function
d2l_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  popq %rcx
  jmpq *%rcx
  .size d2l_emu_switch, .-d2l_emu_switch

  .p2align 4
  .globl d2l_emu_trampoline
  .hidden d2l_emu_trampoline
  .type d2l_emu_trampoline, @function
d2l_emu_trampoline:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size d2l_emu_trampoline, .-d2l_emu_trampoline
)");
extern "C" void d2l_emu_switch(void** save_sp, void* to_sp);
extern "C" void d2l_emu_trampoline();
#endif

namespace d2l::cuda_emu {

namespace {
thread_local Fiber::Impl* t_current = nullptr;  // the fiber running on this OS thread, or null
}

struct Fiber::Impl {
  char* map = nullptr;  // guard page + stack
  size_t map_bytes = 0;
  char* stack_lo = nullptr;
  size_t stack_bytes = 0;
  size_t color = 0;  // the stack starts this many bytes below its top (see the constructor)
  void (*fn)(void*) = nullptr;
  void* arg = nullptr;
  bool* finished = nullptr;  // the owning Fiber's flag
  bool entered = false;      // its stack holds Impl::entry's frame
#ifdef D2L_EMU_ASM_SWITCH
  void* sp = nullptr;        // the fiber's saved stack pointer while it is switched out
  void* sched_sp = nullptr;  // the scheduler's while the fiber runs
#else
  ucontext_t ctx{}, sched_ctx{};
#endif
#ifdef __SANITIZE_ADDRESS__
  void* sched_fake = nullptr;  // ASan's fake-stack handles, one per side
  void* fiber_fake = nullptr;
  const void* sched_bottom = nullptr;  // the scheduler's stack, learnt when the fiber is entered
  size_t sched_size = 0;
#endif
#ifdef __SANITIZE_THREAD__
  void* tsan_fiber = nullptr;
  void* tsan_sched = nullptr;
#endif

  // Scheduler side: switch into the fiber, come back when it yields or finishes.
  void switch_in() {
    t_current = this;
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_start_switch_fiber(&sched_fake, stack_lo, stack_bytes);
#endif
#ifdef __SANITIZE_THREAD__
    tsan_sched = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(tsan_fiber, 0);  // flags 0: the switch orders memory (no false races)
#endif
#ifdef D2L_EMU_ASM_SWITCH
    d2l_emu_switch(&sched_sp, sp);
#else
    swapcontext(&sched_ctx, &ctx);
#endif
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(sched_fake, nullptr, nullptr);
#endif
    t_current = nullptr;
  }

  // Fiber side: back to the scheduler.
  void switch_out() {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_start_switch_fiber(&fiber_fake, sched_bottom, sched_size);
#endif
#ifdef __SANITIZE_THREAD__
    __tsan_switch_to_fiber(tsan_sched, 0);
#endif
#ifdef D2L_EMU_ASM_SWITCH
    d2l_emu_switch(&sp, sched_sp);
#else
    swapcontext(&ctx, &sched_ctx);
#endif
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(fiber_fake, &sched_bottom, &sched_size);
#endif
  }

  // First frame of the fiber, entered once: each start() runs one more turn of the loop. The
  // frame never returns, so every function call inside is matched by its return (TSan keeps a
  // shadow call stack per fiber; a frame abandoned at each restart would pile up there).
  static void entry(Impl* self) {
#ifdef __SANITIZE_ADDRESS__
    __sanitizer_finish_switch_fiber(nullptr, &self->sched_bottom, &self->sched_size);
#endif
    for (;;) {
      self->fn(self->arg);
      *self->finished = true;
      self->switch_out();  // resumed by the next start() + resume()
    }
  }

#ifndef D2L_EMU_ASM_SWITCH
  static void uc_entry(unsigned hi, unsigned lo) {  // makecontext passes ints only
    entry(reinterpret_cast<Impl*>((static_cast<uintptr_t>(hi) << 32) | lo));
  }
#endif
};

Fiber::Fiber(size_t stack_bytes) : impl_(std::make_unique<Impl>()) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  stack_bytes = (stack_bytes + page - 1) / page * page;
  void* p = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
  if (p == MAP_FAILED)
    throw std::runtime_error("emu: cannot map a fiber stack of " + std::to_string(stack_bytes) + " bytes");
  impl_->map = static_cast<char*>(p);
  impl_->map_bytes = stack_bytes + page;
  mprotect(impl_->map, page, PROT_NONE);  // guard page: stacks grow down into it
  impl_->stack_lo = impl_->map + page;
  impl_->stack_bytes = stack_bytes;
  impl_->finished = &finished_;
  // Stacks are page-aligned, so all fibers' hot top frames would share the same cache sets;
  // starting each one 0..63 cache lines lower spreads them (measured here: switching among 1024
  // fibers got 2x faster).
  static std::atomic<unsigned> serial{0};
  impl_->color = serial.fetch_add(1, std::memory_order_relaxed) % 64 * 64;
#ifdef __SANITIZE_THREAD__
  impl_->tsan_fiber = __tsan_create_fiber(0);
  __tsan_set_fiber_name(impl_->tsan_fiber, "emulated CUDA thread");
#endif
}

Fiber::~Fiber() {
#ifdef __SANITIZE_THREAD__
  __tsan_destroy_fiber(impl_->tsan_fiber);
#endif
#ifdef __SANITIZE_ADDRESS__
  ASAN_UNPOISON_MEMORY_REGION(impl_->stack_lo, impl_->stack_bytes);
#endif
  munmap(impl_->map, impl_->map_bytes);
}

void Fiber::start(void (*fn)(void*), void* arg) {
  if (!finished_) throw std::logic_error("emu: Fiber::start on a fiber that has not finished");
  Impl& f = *impl_;
  f.fn = fn;
  f.arg = arg;
  finished_ = false;
  if (f.entered) return;  // the fiber waits at the end of its loop in Impl::entry
  f.entered = true;
#ifdef D2L_EMU_ASM_SWITCH
  // The frame d2l_emu_switch pops: r15 r14 r13 = entry, r12 = impl, rbx rbp, then the return
  // address = trampoline. After the switch pops it, rsp = top (16-byte aligned), so the
  // trampoline's call enters Impl::entry with the ABI's stack alignment.
  uintptr_t top = reinterpret_cast<uintptr_t>(f.stack_lo + f.stack_bytes - f.color) & ~uintptr_t{15};
  void** s = reinterpret_cast<void**>(top - 7 * sizeof(void*));
  std::memset(s, 0, 7 * sizeof(void*));
  s[2] = reinterpret_cast<void*>(&Impl::entry);         // r13
  s[3] = static_cast<void*>(&f);                         // r12
  s[6] = reinterpret_cast<void*>(&d2l_emu_trampoline);  // return address
  f.sp = s;
#else
  getcontext(&f.ctx);
  f.ctx.uc_stack.ss_sp = f.stack_lo;
  f.ctx.uc_stack.ss_size = f.stack_bytes - f.color;
  f.ctx.uc_link = nullptr;
  auto p = reinterpret_cast<uintptr_t>(&f);
  makecontext(&f.ctx, reinterpret_cast<void (*)()>(&Impl::uc_entry), 2, static_cast<unsigned>(p >> 32),
              static_cast<unsigned>(p & 0xffffffffu));
#endif
}

void Fiber::resume() {
  if (finished_) throw std::logic_error("emu: Fiber::resume on a finished fiber");
  if (t_current) throw std::logic_error("emu: Fiber::resume from inside a fiber");
  impl_->switch_in();
}

void Fiber::yield() {
  if (!t_current) throw std::logic_error("emu: Fiber::yield outside a fiber");
  t_current->switch_out();
}

bool Fiber::inside() { return t_current != nullptr; }

}  // namespace d2l::cuda_emu
