// One block of an emulated grid: its threads as fibers on one OS thread, the barriers between
// them, its shared memory. Each OS thread that runs blocks owns one BlockRunner (fibers, stacks
// and the shared-memory arena are reused from block to block).
//
// Scheduling is a deterministic sweep: run thread 0 until it waits or exits, then thread 1, ...
// then release every barrier that all its live threads have reached, and sweep again.
// Plain blocks: most kernels never wait (elementwise kernels, im2col, the naive GEMM), and for them
// the sweep is just thread 0 to its end, then thread 1, ... So a block starts as a plain loop over
// its threads, all on one fiber: no fiber start or switch per thread. If thread k reaches a barrier
// or a shuffle, that fiber becomes thread k's (threads 0..k-1 have exited, which counts as arrived),
// threads k+1.. get fibers of their own, and the sweep goes on from there: the same interleaving,
// hence the same results, as running every thread on its own fiber from the start. A sweep
// that releases nothing while threads still wait is a deadlock: the waiting threads are unwound
// (their barrier call throws an internal exception) and the launch fails with a message naming
// the kernel and where the threads wait. Same inputs, same interleaving: a racy kernel gives
// the same (wrong) answer on every run.
#pragma once
#include <cstddef>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <vector>

#include "kernels/emu/builtins.hpp"
#include "kernels/emu/fiber.hpp"
#include "kernels/emu/shared.hpp"

namespace d2l::cuda_emu {

using builtins::dim3;
using builtins::uint3;

// What every block of one launch runs.
struct BlockJob {
  const char* kernel;     // name, for messages
  dim3 grid, block;
  size_t dynamic_shared;  // bytes
  size_t shared_limit;    // bytes the block may hold in all: kSharedBytes, or kSharedOptInBytes opted in
  void (*body)(void*);    // runs the kernel for the current thread (threadIdx etc. already set)
  void* ctx;
};

class BlockRunner {
 public:
  BlockRunner();
  ~BlockRunner();
  // The calling OS thread's runner (created on first use, destroyed with the thread).
  static BlockRunner& local();
  // The runner executing a block on this OS thread; throws when called outside a kernel.
  static BlockRunner& running(const char* what);

  // Runs every thread of block block_idx to completion. Throws the first exception a thread
  // threw (prefixed with the kernel, block and thread) or the deadlock report. plain: start as a
  // plain loop (above); false: a fiber per thread from the start. Returns true when the block
  // ran as a plain loop to its end (no thread reached a barrier).
  bool run(const BlockJob& job, uint3 block_idx, bool plain = true);

  // Called from kernel code (builtins.hpp / shared.hpp).
  void sync_block();
  void sync_warp(unsigned mask);
  uint64_t exchange(uint64_t bits, int src_lane, unsigned mask);
  void* shared_static(const void* key, size_t bytes, size_t align);
  void* shared_dynamic() { return arena_; }
  // A warp-wide instruction (.sync.aligned: every lane of a full warp executes it together, as
  // ldmatrix and mma.sync do): each lane publishes `bytes` (at most kBlobBytes) and receives all 32
  // lanes', lane l's at all + l * bytes. One warp barrier.
  static constexpr size_t kBlobBytes = 64;
  void warp_gather(const void* mine, size_t bytes, void* all);
  // cp.async (kernels/emu/ptx.hpp), per thread: a copy of `bytes` (4, 8 or 16) to shared memory, of
  // which the first src_bytes come from src and the rest are zeros; it joins the thread's open group.
  // Its destination reads NaN (0xFF bytes) from the issue until the copy lands, which is when a
  // wait leaves fewer pending groups than its group's place: so a missing wait shows as NaN.
  void async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes);
  void async_commit();                // cp.async.commit_group: the open copies become the newest group
  void async_wait(int pending);       // cp.async.wait_group N: all but the newest N groups land

 private:
  enum State : uint8_t { kReady, kAtBlock, kAtWarp, kExited };
  struct Cancelled {};  // thrown out of a barrier to unwind a thread of a cancelled block
  struct Slot {
    const void* key;
    void* ptr;
  };

  static void thread_main(void* self);  // one thread on its own fiber
  static void plain_main(void* self);   // threads 0, 1, ... in turn on one fiber
  bool call_body(int t);                // runs thread t's kernel code; false when it threw
  void exit_thread(int t);
  void fall_back();                     // the plain loop's thread reached a barrier (see above)
  void init_sweep(int exited);          // scheduler state: threads < exited have exited
  uint3 tid(int t) const {  // threadIdx of thread t (divisions: the sweep reads tid_ instead)
    const unsigned u = static_cast<unsigned>(t);
    return {u % bx_, u / bx_ % by_, u / bxy_};
  }
  void wait_at(State where, unsigned mask = 0);
  bool release();  // releases every complete barrier; false when none was
  void cancel();   // unwinds every waiting thread
  std::string deadlock_report() const;
  std::string where(int t) const;  // "block (x,y,z) thread (x,y,z)"
  int warp_lanes(int w) const { return n_ - 32 * w < 32 ? n_ - 32 * w : 32; }

  const BlockJob* job_ = nullptr;
  uint3 block_idx_{0, 0, 0};
  int n_ = 0;        // threads in the block
  unsigned bx_ = 1, by_ = 1, bxy_ = 1;  // blockDim.x, .y, .x * .y
  bool plain_ = false;  // the block runs as a plain loop (no thread has reached a barrier yet)
  int current_ = 0;  // the thread running now
  int exited_ = 0, at_block_ = 0;
  bool cancelled_ = false;
  std::exception_ptr error_;
  std::vector<std::unique_ptr<Fiber>> fibers_;
  std::vector<State> state_;
  std::vector<uint3> tid_;      // threadIdx of each thread, for the sweep (built for tid_dims_)
  dim3 tid_dims_{0, 0, 0};
  std::vector<unsigned> mask_;  // lanes a thread waiting at a warp barrier waits for
  std::vector<int> warp_waiting_;  // threads of each warp waiting at a warp barrier
  std::vector<uint64_t> lane_bits_;  // shuffle mailbox, two slots per thread (exchange)
  std::vector<uint32_t> published_;  // values each thread has published there
  std::vector<unsigned char> lane_blob_;  // warp_gather's mailbox: two kBlobBytes slots per thread
  struct AsyncCopy {
    unsigned char* dst;
    size_t bytes;
    unsigned char data[16];  // read at the issue (global memory does not change under a kernel)
  };
  std::vector<std::vector<AsyncCopy>> async_open_;                // per thread: issued, not committed
  std::vector<std::vector<std::vector<AsyncCopy>>> async_groups_;  // per thread: committed, oldest first
  // (both empty until the block's first cp.async: most blocks never use one)
  std::vector<Slot> slots_;          // static shared declarations used by this block
  size_t shared_used_ = 0;   // arena offset of the next allocation
  size_t shared_bytes_ = 0;  // bytes the block has declared (checked against the job's shared_limit)
  // Under ASan, allocations are separated by poisoned redzones, so an index past the end of a
  // shared array is reported as an error instead of reading the neighbouring array.
#ifdef __SANITIZE_ADDRESS__
  static constexpr size_t kRedzone = 32, kArenaBytes = 2 * kSharedOptInBytes;
#else
  static constexpr size_t kRedzone = 0, kArenaBytes = kSharedOptInBytes;
#endif
  alignas(128) unsigned char arena_[kArenaBytes];  // CUDA aligns shared arrays up to 128 bytes (__align__(128))
};

}  // namespace d2l::cuda_emu
