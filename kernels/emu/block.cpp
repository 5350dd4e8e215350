// Block scheduler: fibers, barriers, deadlock detection, shared memory (see block.hpp).
#include "kernels/emu/block.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/cpu/asan_poison.hpp"

namespace d2l::cuda_emu {

namespace {
thread_local BlockRunner* t_running = nullptr;  // the runner whose block runs on this OS thread

std::string str3(uint3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}
}  // namespace

BlockRunner::BlockRunner() = default;
BlockRunner::~BlockRunner() = default;

BlockRunner& BlockRunner::local() {
  thread_local std::unique_ptr<BlockRunner> runner;
  if (!runner) runner = std::make_unique<BlockRunner>();
  return *runner;
}

BlockRunner& BlockRunner::running(const char* what) {
  if (!t_running || !Fiber::inside())
    throw std::logic_error(std::string(what) + " called outside an emulated kernel");
  return *t_running;
}

bool BlockRunner::run(const BlockJob& job, uint3 block_idx, bool plain) {
  job_ = &job;
  block_idx_ = block_idx;
  const dim3 b = job.block;
  n_ = static_cast<int>(b.x * b.y * b.z);
  bx_ = b.x;
  by_ = b.y;
  bxy_ = b.x * b.y;
  exited_ = at_block_ = 0;
  cancelled_ = false;
  async_open_.clear();  // copies a thread left pending in an earlier block never land
  async_groups_.clear();
  error_ = nullptr;
  slots_.clear();
  shared_bytes_ = job.dynamic_shared;
  shared_used_ = (job.dynamic_shared + 15) / 16 * 16 + kRedzone;
#ifdef __SANITIZE_ADDRESS__
  D2L_POISON(arena_, std::min(kArenaBytes, 2 * job.shared_limit));  // what the block may reach (redzones included)
  D2L_UNPOISON(arena_, job.dynamic_shared);
#endif
  if (job.dynamic_shared > 0) std::memset(arena_, 0xFF, job.dynamic_shared);  // NaN: see shared.hpp

  builtins::blockIdx = block_idx;
  builtins::blockDim = job.block;
  builtins::gridDim = job.grid;
  t_running = this;
  struct Reset {
    ~Reset() { t_running = nullptr; }
  } reset;
  if (fibers_.empty()) fibers_.push_back(std::make_unique<Fiber>(kFiberStackBytes));
  int first = 0;  // the first thread the sweep has yet to start
  if (plain) {
    plain_ = true;
    current_ = 0;
    fibers_[0]->start(&plain_main, this);
    fibers_[0]->resume();  // returns when every thread has run, one threw, or one waits (fall_back)
    if (plain_) {
      plain_ = false;
      if (error_) {
        std::exception_ptr e = error_;
        error_ = nullptr;
        std::rethrow_exception(e);
      }
      return true;
    }
    // Thread current_ waits on the loop's fiber: make that fiber its own.
    first = current_ + 1;
    std::swap(fibers_[0], fibers_[current_]);
  } else {
    while (static_cast<int>(fibers_.size()) < n_) fibers_.push_back(std::make_unique<Fiber>(kFiberStackBytes));
    init_sweep(0);
  }
  for (int t = first; t < n_; ++t) fibers_[t]->start(&thread_main, this);

  for (;;) {
    for (int t = 0; t < n_; ++t) {  // one sweep: each ready thread runs to its next wait or its end
      if (state_[t] != kReady) continue;
      current_ = t;
      builtins::threadIdx = tid_[t];
      fibers_[t]->resume();
    }
    if (exited_ == n_) break;
    if (error_) {  // a thread threw: stop the block, report that
      cancel();
      break;
    }
    if (!release()) {  // nobody can move on
      error_ = std::make_exception_ptr(std::runtime_error(deadlock_report()));
      cancel();
      break;
    }
  }
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
  return false;
}

void BlockRunner::init_sweep(int exited) {
  const dim3 b = job_->block;
  if (b.x != tid_dims_.x || b.y != tid_dims_.y || b.z != tid_dims_.z) {
    tid_.resize(n_);
    for (int t = 0; t < n_; ++t) tid_[t] = tid(t);
    tid_dims_ = b;
  }
  state_.assign(n_, kReady);
  std::fill(state_.begin(), state_.begin() + exited, kExited);
  exited_ = exited;
  mask_.assign(n_, 0);
  warp_waiting_.assign((n_ + 31) / 32, 0);
  lane_bits_.assign(2 * n_, ~uint64_t{0});
  lane_blob_.assign(2 * kBlobBytes * n_, 0xFF);
  published_.assign(n_, 0);
}

// Called by the plain loop's thread current_ at its first barrier: threads before it have exited,
// the ones after it have not started; from here on every thread is scheduled by the sweep.
void BlockRunner::fall_back() {
  plain_ = false;
  while (static_cast<int>(fibers_.size()) < n_) fibers_.push_back(std::make_unique<Fiber>(kFiberStackBytes));
  init_sweep(current_);
}

bool BlockRunner::call_body(int t) {
  try {
    job_->body(job_->ctx);
    return true;
  } catch (const Cancelled&) {
    // unwound by cancel(): the block's error is already recorded
  } catch (const std::exception& e) {
    if (!error_)
      error_ = std::make_exception_ptr(
          std::runtime_error("kernel " + std::string(job_->kernel) + " " + where(t) + ": " + e.what()));
  } catch (...) {
    if (!error_) error_ = std::current_exception();
  }
  return false;
}

void BlockRunner::exit_thread(int t) {
  state_[t] = kExited;
  ++exited_;
}

// First frame of every emulated thread that has a fiber of its own.
void BlockRunner::thread_main(void* p) {
  auto* self = static_cast<BlockRunner*>(p);
  const int t = self->current_;
  self->call_body(t);
  self->exit_thread(t);
}

// The plain loop: thread 0, 1, ... each to its end, on one fiber. Stops at the first error (the
// block fails with it) or after the thread that fell back to the sweep has finished.
void BlockRunner::plain_main(void* p) {
  auto* self = static_cast<BlockRunner*>(p);
  const unsigned bx = self->bx_, by = self->by_;
  uint3 idx{0, 0, 0};  // threadIdx of t, stepped without divisions
  for (int t = 0; t < self->n_; ++t) {
    self->current_ = t;
    builtins::threadIdx = idx;
    const bool ok = self->call_body(t);
    if (!self->plain_) return self->exit_thread(t);  // t reached a barrier: the sweep ran it since
    if (!ok) return;
    if (++idx.x == bx) {
      idx.x = 0;
      if (++idx.y == by) idx.y = 0, ++idx.z;
    }
  }
}

void BlockRunner::wait_at(State where, unsigned mask) {
  if (plain_) fall_back();
  const int t = current_;
  if (cancelled_) throw Cancelled{};
  state_[t] = where;
  if (where == kAtBlock) {
    ++at_block_;
  } else {
    ++warp_waiting_[t / 32];
    mask_[t] = mask | 1u << (t % 32);  // a lane always waits for itself
  }
  Fiber::yield();
  if (cancelled_) throw Cancelled{};
}

void BlockRunner::sync_block() { wait_at(kAtBlock); }
void BlockRunner::sync_warp(unsigned mask) { wait_at(kAtWarp, mask); }

// One warp barrier per shuffle: each thread publishes its k-th value in slot k % 2 of its
// mailbox, so a lane that has read and run on to its next shuffle writes the other slot, never
// the value a slower lane of its warp has yet to read (it cannot get two shuffles ahead: the next
// barrier waits for that lane).
uint64_t BlockRunner::exchange(uint64_t bits, int src_lane, unsigned mask) {
  if (plain_) fall_back();  // before the mailbox is written: fall_back resets it
  const int t = current_;
  const uint32_t round = published_[t]++;
  lane_bits_[2 * t + (round & 1)] = bits;
  wait_at(kAtWarp, mask);  // every live lane of the mask has published
  const int src = (t & ~31) + src_lane;
  if (src_lane < 0 || src_lane >= 32 || src >= n_) return ~uint64_t{0};
  const uint32_t n = published_[src];
  if (n > round) return lane_bits_[2 * src + (round & 1)];  // its value of this round (it may have exited since)
  // A lane that has exited or never published: undefined on a GPU, all-ones bits (NaN) here. A
  // live lane outside the mask that has not reached this round gives its last value.
  if (state_[src] == kExited || n == 0) return ~uint64_t{0};
  return lane_bits_[2 * src + ((n - 1) & 1)];
}

// The same mailbox rule as exchange, with a payload of up to kBlobBytes: the round counter is
// shared, so shuffles and warp-wide instructions may follow each other in any order.
void BlockRunner::warp_gather(const void* mine, size_t bytes, void* all) {
  if (bytes > kBlobBytes) throw std::logic_error("warp_gather: at most 64 bytes a lane");
  if (plain_) fall_back();
  const int t = current_, w = t / 32;
  if (warp_lanes(w) != 32)
    throw std::runtime_error("a warp-wide instruction (ldmatrix, mma.sync) needs a full warp of 32 threads");
  const uint32_t round = published_[t]++;
  std::memcpy(&lane_blob_[(2 * t + (round & 1)) * kBlobBytes], mine, bytes);
  wait_at(kAtWarp, 0xffffffffu);
  for (int l = 0; l < 32; ++l) {
    const int src = 32 * w + l;
    if (published_[src] <= round)  // never got here (it exited first); one that published and exited since is fine
      throw std::runtime_error("a warp-wide instruction (ldmatrix, mma.sync) was not executed by every lane of the warp");
    std::memcpy(static_cast<unsigned char*>(all) + l * bytes, &lane_blob_[(2 * src + (round & 1)) * kBlobBytes], bytes);
  }
}

void BlockRunner::async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  if (bytes != 4 && bytes != 8 && bytes != 16) throw std::logic_error("cp.async copies 4, 8 or 16 bytes");
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0))
    misaligned_load(reinterpret_cast<uintptr_t>(dst) % bytes != 0 ? dst : src, bytes);
  if (async_open_.empty()) async_open_.resize(n_), async_groups_.resize(n_);  // the block's first cp.async
  AsyncCopy c{static_cast<unsigned char*>(dst), bytes, {}};
  std::memset(c.data, 0, sizeof c.data);  // zero-fill past src_bytes (cp.async's src-size)
  std::memcpy(c.data, src, std::min(bytes, src_bytes));
  std::memset(dst, 0xFF, bytes);  // NaN until the copy lands
  async_open_[current_].push_back(c);
}

void BlockRunner::async_commit() {
  if (async_open_.empty()) async_open_.resize(n_), async_groups_.resize(n_);
  auto& open = async_open_[current_];
  async_groups_[current_].push_back(std::move(open));  // an empty group too, as on the GPU
  open.clear();
}

void BlockRunner::async_wait(int pending) {
  if (async_groups_.empty()) return;  // nothing issued in this block
  auto& groups = async_groups_[current_];
  const size_t landing = groups.size() > static_cast<size_t>(pending) ? groups.size() - pending : 0;
  for (size_t g = 0; g < landing; ++g)  // the oldest first
    for (const AsyncCopy& c : groups[g]) std::memcpy(c.dst, c.data, c.bytes);
  groups.erase(groups.begin(), groups.begin() + static_cast<std::ptrdiff_t>(landing));
}

bool BlockRunner::release() {
  bool any = false;
  if (at_block_ > 0 && at_block_ + exited_ == n_) {  // exited threads count as arrived
    for (State& s : state_)
      if (s == kAtBlock) s = kReady;
    at_block_ = 0;
    any = true;
  }
  for (int w = 0; w < static_cast<int>(warp_waiting_.size()); ++w) {
    if (warp_waiting_[w] == 0) continue;
    // Release when every live lane that some waiting lane's mask names is waiting too.
    unsigned live = 0, waiting = 0, needed = 0;
    for (int l = 0; l < warp_lanes(w); ++l) {
      const int t = 32 * w + l;
      if (state_[t] != kExited) live |= 1u << l;
      if (state_[t] == kAtWarp) waiting |= 1u << l, needed |= mask_[t];
    }
    if ((needed & live & ~waiting) != 0) continue;
    for (int l = 0; l < warp_lanes(w); ++l)
      if (waiting >> l & 1u) state_[32 * w + l] = kReady;
    warp_waiting_[w] = 0;
    any = true;
  }
  return any;
}

void BlockRunner::cancel() {
  cancelled_ = true;
  for (int t = 0; t < n_; ++t) {
    if (state_[t] != kAtBlock && state_[t] != kAtWarp) continue;
    state_[t] = kReady;
    current_ = t;
    builtins::threadIdx = tid_[t];
    fibers_[t]->resume();  // its barrier throws Cancelled; the thread unwinds and exits
  }
}

std::string BlockRunner::deadlock_report() const {
  int at_warp = 0;
  for (int w : warp_waiting_) at_warp += w;
  std::string s = "deadlock in kernel " + std::string(job_->kernel) + ": ";
  std::string of = " of " + std::to_string(n_) + " threads";
  if (at_block_ > 0) s += std::to_string(at_block_) + of + " wait at __syncthreads";
  if (at_warp > 0)
    s += (at_block_ > 0 ? ", " + std::to_string(at_warp) : std::to_string(at_warp) + of + " wait") +
         " at __syncwarp or a warp shuffle";
  if (exited_ > 0) s += ", the rest exited";
  return s + " (block " + str3(block_idx_) + ")";
}

std::string BlockRunner::where(int t) const { return "block " + str3(block_idx_) + " thread " + str3(tid(t)); }

void* BlockRunner::shared_static(const void* key, size_t bytes, size_t align) {
  for (const Slot& s : slots_)
    if (s.key == key) return s.ptr;
  const size_t a = align < 16 ? 16 : align;  // the address, not only the offset, aligned to `a`
  const uintptr_t base = reinterpret_cast<uintptr_t>(arena_);
  const size_t offset = (base + shared_used_ + a - 1) / a * a - base;
  shared_bytes_ = (shared_bytes_ + a - 1) / a * a + bytes;
  if (shared_bytes_ > job_->shared_limit || offset + bytes > kArenaBytes)
    throw std::runtime_error("shared memory needs " + std::to_string(shared_bytes_) + " bytes (static + dynamic), more than the " +
                             std::to_string(job_->shared_limit) + " (" + std::to_string(job_->shared_limit / 1024) +
                             " KiB) a block may use");
  void* p = arena_ + offset;
  D2L_UNPOISON(p, bytes);
  std::memset(p, 0xFF, bytes);  // NaN until written
  shared_used_ = offset + bytes + kRedzone;
  slots_.push_back({key, p});
  return p;
}

// ---- the entry points kernel code calls (builtins.hpp, shared.hpp)
void sync_block() { BlockRunner::running("__syncthreads").sync_block(); }
void sync_warp(unsigned mask) { BlockRunner::running("__syncwarp").sync_warp(mask); }
uint64_t warp_exchange(uint64_t bits, int src_lane, unsigned mask) {
  return BlockRunner::running("a warp shuffle").exchange(bits, src_lane, mask);
}
void warp_gather(const void* mine, size_t bytes, void* all) {
  BlockRunner::running("a warp-wide instruction").warp_gather(mine, bytes, all);
}
void async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes) {
  BlockRunner::running("cp.async").async_copy(dst, src, bytes, src_bytes);
}
void async_commit() { BlockRunner::running("cp.async.commit_group").async_commit(); }
void async_wait(int pending) { BlockRunner::running("cp.async.wait_group").async_wait(pending); }
void* shared_static(const void* key, size_t bytes, size_t align) {
  return BlockRunner::running("D2L_SHARED").shared_static(key, bytes, align);
}
void* shared_dynamic() { return BlockRunner::running("D2L_DYNAMIC_SHARED").shared_dynamic(); }

}  // namespace d2l::cuda_emu
