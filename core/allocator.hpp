// A caching allocator per device (DESIGN.md): freed blocks go to a free list and are handed out
// again without a new system allocation. Counts requested bytes exactly: in use, peak.
// Under ASan, cached blocks are poisoned so a use after free still reports.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

namespace d2l {

struct MemoryStats {
  int64_t in_use = 0;         // bytes of live tensors (as requested)
  int64_t peak = 0;           // maximum of in_use since the last reset_peak()
  int64_t cached = 0;         // bytes held in free blocks
  int64_t system_allocs = 0;  // calls to the system allocator
  int64_t reuses = 0;         // requests served from the cache
};

// Where blocks come from: host memory (cpu and emu devices) or a GPU's memory through the CUDA layer.
struct SystemMemory {
  int gpu = -1;  // -1: host memory (aligned_alloc / free, ASan-poisoned while cached); else that GPU
};

class Allocator : public std::enable_shared_from_this<Allocator> {
 public:
  explicit Allocator(std::string device_name, SystemMemory mem = {}) : name_(std::move(device_name)), mem_(mem) {}
  ~Allocator();
  void* allocate(size_t bytes);  // 64-byte aligned; bytes == 0 gives a valid 64-byte block
  void deallocate(void* p, size_t bytes);
  MemoryStats stats() const;
  void reset_peak();
  void empty_cache();  // returns free blocks to the system
  static size_t block_size(size_t bytes);  // rounded up to 256 bytes

 private:
  void* system_alloc(size_t size);
  void system_free(void* p, size_t size);
  std::string name_;
  SystemMemory mem_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // block size -> block
  MemoryStats s_;
};

// Device memory owned by tensors; returns its block when the last holder (a tensor, or a queued
// task that touches it) lets go.
struct Storage {
  Storage(std::shared_ptr<Allocator> a, size_t bytes) : alloc(std::move(a)), bytes(bytes), ptr(alloc->allocate(bytes)) {}
  ~Storage() { alloc->deallocate(ptr, bytes); }
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  std::shared_ptr<Allocator> alloc;
  size_t bytes;
  void* ptr;
};

}  // namespace d2l
