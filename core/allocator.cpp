#include "core/allocator.hpp"

#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/gpu/cuda_layer.hpp"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define D2L_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define D2L_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define D2L_POISON(p, n) ((void)(p), (void)(n))
#define D2L_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace d2l {

// D2L_FILL_NAN=1 fills every allocation with NaN (tests run with it, so a kernel that reads memory
// it never wrote gives NaN instead of a plausible stale value).
static bool fill_nan() {
  static const bool on = [] {
    const char* s = std::getenv("D2L_FILL_NAN");
    return s && *s && *s != '0';
  }();
  return on;
}

size_t Allocator::block_size(size_t bytes) { return bytes == 0 ? 256 : (bytes + 255) / 256 * 256; }

Allocator::~Allocator() { empty_cache(); }

void* Allocator::system_alloc(size_t size) {
  if (mem_.gpu >= 0) {
    try {
      return cuda_layer::malloc(mem_.gpu, size);
    } catch (const std::exception&) {  // out of memory: give the cached blocks back and try once more
      for (auto& [n, p] : free_) cuda_layer::free(mem_.gpu, p);
      free_.clear();
      s_.cached = 0;
      return cuda_layer::malloc(mem_.gpu, size);
    }
  }
  void* p = std::aligned_alloc(64, size);
  if (!p) throw std::bad_alloc();
  return p;
}

void Allocator::system_free(void* p, size_t size) {
  if (mem_.gpu >= 0) return cuda_layer::free(mem_.gpu, p);
  D2L_UNPOISON(p, size);
  std::free(p);
}

void* Allocator::allocate(size_t bytes) {
  size_t size = block_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = nullptr;
  // Reuse the smallest cached block that fits and wastes less than half of it.
  auto it = free_.lower_bound(size);
  if (it != free_.end() && it->first <= 2 * size) {
    p = it->second;
    s_.cached -= static_cast<int64_t>(it->first);
    free_.erase(it);
    ++s_.reuses;
    // The block may be larger than `size`; keep its true size with the pointer for deallocate.
    if (mem_.gpu < 0) D2L_UNPOISON(p, size);
  } else {
    p = system_alloc(size);
    ++s_.system_allocs;
  }
  s_.in_use += static_cast<int64_t>(bytes);
  if (s_.in_use > s_.peak) s_.peak = s_.in_use;
  if (fill_nan()) {  // every float a NaN: reading before writing shows
    if (mem_.gpu >= 0) cuda_layer::fill_bytes(mem_.gpu, p, 0xFF, bytes);
    else std::memset(p, 0xFF, bytes);
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes) {
  size_t size = block_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  s_.in_use -= static_cast<int64_t>(bytes);
  // A reused block may be up to 2x `size`; it is cached under `size`, which only under-uses it.
  if (mem_.gpu < 0) D2L_POISON(p, size);
  free_.emplace(size, p);
  s_.cached += static_cast<int64_t>(size);
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.in_use;
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, p] : free_) {
    system_free(p, size);
  }
  free_.clear();
  s_.cached = 0;
}

}  // namespace d2l
