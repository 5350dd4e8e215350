// A caching allocator per device (docs/devices-and-streams.md): freed blocks go to a
// free list and are handed out again without a new system allocation. Counts requested bytes
// exactly: in use, peak (every buffer, kernels' scratch included).
//
// The rule (PyTorch's caching allocator's): a block is freed when the HOST lets go of it, while work
// queued on its stream may still read it. It goes back to the pool with a point in that stream
// ("everything enqueued so far", core/stream.hpp) and in every other stream that used it:
//   - a later allocation for the SAME stream gets it at once: its work is queued after the old
//     readers, and a stream runs its work in order;
//   - an allocation for another stream, or for the host, gets it once those points are reached;
//   - a kernel's scratch, asked for while a task runs (`in_task`), gets it once the old readers on
//     its own stream have run (they were queued before the running task) and the others are reached.
// A request the cache cannot serve first gives back finished cached blocks of other sizes (largest
// first) while the memory taken from the system would exceed what was ever in use at once (plus 1/16):
// the cache stays about the size of the peak, as a process that calls malloc and free would be.
// Under ASan, cached blocks are poisoned once their last reader is done, so a use after free reports.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/stream.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l {

// What a buffer holds, told to the allocator when it is handed out (MemoryTagScope below), so that
// memory is measured from the buffers that exist rather than recomputed from a formula: chapter 5
// prints each device's bytes by tag beside the ZeRO paper's model. Scratch asked for by a running
// kernel (`in_task`) is always `other`.
enum class MemoryTag : uint8_t {
  other,             // activations, kernels' scratch and every temporary
  parameters,        // a parameter's replicas (and ZeRO-3's parameter shards)
  gradients,         // the .grad buffers autograd adds into
  summed_gradients,  // a gradient's sum over the replicas kept apart from .grad (ZeRO-2's and 3's shards)
  optimizer_state,   // momentum; Adam's m and v
  gathered,          // ZeRO-3's units made whole for a forward or a backward
};
inline constexpr int kMemoryTags = 6;
const char* memory_tag_name(MemoryTag t);  // "other", "parameters", ...

// While one is alive, the buffers this thread asks for are tagged `tag` (scopes nest).
class MemoryTagScope : NoCopy {
 public:
  explicit MemoryTagScope(MemoryTag tag);
  ~MemoryTagScope();

 private:
  MemoryTag prev_;
};
MemoryTag current_memory_tag();

struct MemoryStats {
  int64_t in_use = 0;         // bytes of live tensors and scratch buffers (as requested)
  int64_t by_tag[kMemoryTags] = {};   // in_use by what the buffers hold ([int(MemoryTag)])
  int64_t at_peak[kMemoryTags] = {};  // by_tag at the moment of the peak: what the peak is made of
  int64_t held(MemoryTag t) const { return by_tag[static_cast<int>(t)]; }
  int64_t peak = 0;           // maximum of in_use since the last reset_peak()
  int64_t cached = 0;         // bytes held in free blocks
  int64_t reserved = 0;       // bytes taken from the system and not returned (blocks in use and cached)
  int64_t reserved_peak = 0;  // maximum of reserved (PyTorch's max_memory_reserved)
  int64_t system_allocs = 0;  // calls to the system allocator
  int64_t reuses = 0;         // requests served from the cache
};

// Where blocks come from: host memory (cpu and emu devices) or a GPU's memory through the CUDA layer.
struct SystemMemory {
  int gpu = -1;  // -1: host memory (aligned_alloc / free, ASan-poisoned while cached); else that GPU
};

// D2L_FILL_NAN=1: every new allocation is filled with NaN (tests run with it).
bool fill_nan();

// Whose work will use a new block.
struct AllocFor {
  const StreamClock* stream = nullptr;  // that stream's later work; null: the host, now
  bool in_task = false;                 // asked by a task running on `stream` (scratch), for use now
};

class Allocator : public std::enable_shared_from_this<Allocator> {
 public:
  explicit Allocator(std::string device_name, SystemMemory mem = {}) : name_(std::move(device_name)), mem_(mem) {}
  ~Allocator();
  void* allocate(size_t bytes, AllocFor use = {});  // 64-byte aligned; bytes == 0 gives a valid block
  // `points`: where the block's users are (none: it is free for anyone now).
  void deallocate(void* p, size_t bytes, std::vector<StreamPoint> points = {});
  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();  // returns the free blocks whose users are done to the system
  void count(int64_t bytes);  // memory taken (+) or returned (-) elsewhere: gpu(i) kernels' scratch
  static size_t block_size(size_t bytes);  // rounded up to 256 bytes
  // The live block at p now holds what `tag` says (a temporary kept as a leaf's .grad, say).
  void retag(void* p, MemoryTag tag);

 private:
  struct Block {
    void* p;
    std::vector<StreamPoint> points;
  };
  static bool usable(const Block& b, AllocFor use);
  void* system_alloc(size_t size);
  void system_free(void* p, size_t size);
  void poison_finished();  // ASan: poisons cached blocks whose readers are done
  std::string name_;
  SystemMemory mem_;
  mutable std::mutex mu_;
  std::multimap<size_t, Block> free_;  // block size -> block
  std::vector<std::pair<size_t, Block>> to_poison_;  // ASan: cached, but a reader may still run
  struct Live {
    size_t size;     // its true size (a reused block may be larger than asked)
    int64_t bytes;   // as requested
    MemoryTag tag;
  };
  std::unordered_map<void*, Live> live_;  // blocks in use
  void add_in_use(int64_t bytes, MemoryTag tag);
  int64_t high_water_ = 0;                  // the most bytes ever in use (never reset)
  MemoryStats s_;
};

// Device memory owned by tensors. Allocated for the `home` stream's work; returns its block when the
// last holder lets go, with a point in `home` and in every stream recorded as a user.
struct Storage : NoCopy {
  Storage(std::shared_ptr<Allocator> a, size_t bytes, std::shared_ptr<const StreamClock> home = nullptr)
      : alloc(std::move(a)), bytes(bytes), home(std::move(home)), ptr(alloc->allocate(bytes, {this->home.get()})) {}
  ~Storage();
  // Work on stream `s` (not home) reads or writes this storage without holding it: its block is not
  // reused by others before that work is done (PyTorch's record_stream).
  void record_stream(const std::shared_ptr<const StreamClock>& s);
  std::shared_ptr<Allocator> alloc;
  size_t bytes;
  std::shared_ptr<const StreamClock> home;
  void* ptr;

 private:
  std::mutex mu_;
  std::vector<std::shared_ptr<const StreamClock>> users_;
};

}  // namespace d2l
