#include "core/allocator.hpp"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>

#include "core/gpu/cuda_layer.hpp"

#include "kernels/cpu/asan_poison.hpp"

namespace d2l {

// D2L_FILL_NAN=1 fills every allocation with NaN (tests run with it, so a kernel that reads memory
// it never wrote gives NaN instead of a plausible stale value).
bool fill_nan() {
  static const bool on = [] {
    const char* s = std::getenv("D2L_FILL_NAN");
    return s && *s && *s != '0';
  }();
  return on;
}

const char* memory_tag_name(MemoryTag t) {
  static const char* names[kMemoryTags] = {"other", "parameters", "gradients", "summed_gradients", "optimizer_state",
                                           "gathered"};
  return names[static_cast<int>(t)];
}

static thread_local MemoryTag g_tag = MemoryTag::other;
MemoryTagScope::MemoryTagScope(MemoryTag tag) : prev_(g_tag) { g_tag = tag; }
MemoryTagScope::~MemoryTagScope() { g_tag = prev_; }
MemoryTag current_memory_tag() { return g_tag; }

// in_use changes by `bytes` (negative: returned) for buffers holding `tag`; a new peak records what it is made of.
void Allocator::add_in_use(int64_t bytes, MemoryTag tag) {
  s_.in_use += bytes;
  s_.by_tag[static_cast<int>(tag)] += bytes;
  if (s_.in_use > s_.peak) {
    s_.peak = s_.in_use;
    std::copy(std::begin(s_.by_tag), std::end(s_.by_tag), std::begin(s_.at_peak));
  }
}

size_t Allocator::block_size(size_t bytes) { return bytes == 0 ? 256 : (bytes + 255) / 256 * 256; }

Allocator::~Allocator() {
  // The device's streams are gone (drained) when its allocator goes: every block may be returned.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [size, b] : free_) system_free(b.p, size);
  free_.clear();
}

// Stream-ordered reuse (allocator.hpp): a point in the requesting stream itself needs nothing (or, for
// a task's scratch, that its tasks have run); any other point must be reached.
bool Allocator::usable(const Block& b, AllocFor use) {
  for (const StreamPoint& pt : b.points) {
    if (use.stream && pt.clock.get() == use.stream) {
      if (use.in_task && !pt.issued()) return false;
    } else if (!pt.reached()) {
      return false;
    }
  }
  return true;
}

void* Allocator::system_alloc(size_t size) {
  if (mem_.gpu >= 0) {
    try {
      return cuda_layer::malloc(mem_.gpu, size);
    } catch (const std::exception&) {  // out of memory: give the finished cached blocks back, try once more
      for (auto it = free_.begin(); it != free_.end();) {
        if (!usable(it->second, {})) {
          ++it;
          continue;
        }
        cuda_layer::free(mem_.gpu, it->second.p);
        s_.cached -= static_cast<int64_t>(it->first);
        s_.reserved -= static_cast<int64_t>(it->first);
        it = free_.erase(it);
      }
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

void Allocator::poison_finished() {
#if defined(__SANITIZE_ADDRESS__)
  for (size_t i = 0; i < to_poison_.size();) {
    auto& [size, b] = to_poison_[i];
    if (!usable(b, {})) {
      ++i;
      continue;
    }
    auto [lo, hi] = free_.equal_range(size);  // still cached (not handed out again meanwhile)?
    for (auto it = lo; it != hi; ++it)  // (freed again since? then its own, newer points decide)
      if (it->second.p == b.p && usable(it->second, {})) D2L_POISON(b.p, size);
    to_poison_[i] = std::move(to_poison_.back());
    to_poison_.pop_back();
  }
#endif
}

void* Allocator::allocate(size_t bytes, AllocFor use) {
  size_t size = block_size(bytes);
  std::lock_guard<std::mutex> lock(mu_);
  poison_finished();
  void* p = nullptr;
  // Reuse the smallest usable cached block that fits and wastes less than half of it.
  for (auto it = free_.lower_bound(size); it != free_.end() && it->first <= 2 * size; ++it) {
    if (!usable(it->second, use)) continue;
    p = it->second.p;
    live_[p].size = it->first;  // its true size, which may be up to twice `size`
    s_.cached -= static_cast<int64_t>(it->first);
    free_.erase(it);
    ++s_.reuses;
    if (mem_.gpu < 0) D2L_UNPOISON(p, live_[p].size);
    break;
  }
  if (!p) {
    // Keep what is taken from the system near the most ever in use: give back finished blocks of
    // other sizes, largest first, before taking more.
    const int64_t limit = std::max(high_water_, s_.in_use + static_cast<int64_t>(bytes)) * 17 / 16;
    for (auto it = free_.end(); s_.reserved + static_cast<int64_t>(size) > limit && it != free_.begin();) {
      --it;
      if (!usable(it->second, {})) continue;
      system_free(it->second.p, it->first);
      s_.cached -= static_cast<int64_t>(it->first);
      s_.reserved -= static_cast<int64_t>(it->first);
      it = free_.erase(it);
    }
    p = system_alloc(size);
    live_[p].size = size;
    ++s_.system_allocs;
    s_.reserved += static_cast<int64_t>(size);
    s_.reserved_peak = std::max(s_.reserved_peak, s_.reserved);
  }
  const MemoryTag tag = use.in_task ? MemoryTag::other : g_tag;
  live_[p].bytes = static_cast<int64_t>(bytes), live_[p].tag = tag;
  add_in_use(static_cast<int64_t>(bytes), tag);
  high_water_ = std::max(high_water_, s_.in_use);
  // Every float a NaN, so reading before writing shows. For a stream's later work the fill is that
  // stream's work too (Tensor::empty queues it): earlier readers of the block may still be queued.
  if (fill_nan() && (!use.stream || use.in_task)) {
    if (mem_.gpu < 0) std::memset(p, 0xFF, bytes);
    else if (!use.stream) cuda_layer::fill_bytes(mem_.gpu, p, 0xFF, bytes);
  }
  return p;
}

void Allocator::deallocate(void* p, size_t bytes, std::vector<StreamPoint> points) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(p);
  const size_t size = live != live_.end() ? live->second.size : block_size(bytes);
  const MemoryTag tag = live != live_.end() ? live->second.tag : MemoryTag::other;
  if (live != live_.end()) live_.erase(live);
  add_in_use(-static_cast<int64_t>(bytes), tag);
  Block b{p, std::move(points)};
  if (mem_.gpu < 0) {
    if (usable(b, {})) D2L_POISON(p, size);
    else to_poison_.push_back({size, b});  // queued work may still read it: poisoned once it is done
  }
  free_.emplace(size, std::move(b));
  s_.cached += static_cast<int64_t>(size);
  poison_finished();
}

void Allocator::count(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  add_in_use(bytes, MemoryTag::other);
}

void Allocator::retag(void* p, MemoryTag tag) {
  std::lock_guard<std::mutex> lock(mu_);
  auto live = live_.find(p);
  if (live == live_.end() || live->second.tag == tag) return;
  s_.by_tag[static_cast<int>(live->second.tag)] -= live->second.bytes;
  s_.by_tag[static_cast<int>(tag)] += live->second.bytes;
  live->second.tag = tag;
}

MemoryStats Allocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void Allocator::reset_peak() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak = s_.in_use;
  std::copy(std::begin(s_.by_tag), std::end(s_.by_tag), std::begin(s_.at_peak));
}

void Allocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = free_.begin(); it != free_.end();) {
    if (!usable(it->second, {})) {  // queued work still reads it: it stays cached
      ++it;
      continue;
    }
    system_free(it->second.p, it->first);
    s_.cached -= static_cast<int64_t>(it->first);
    s_.reserved -= static_cast<int64_t>(it->first);
    it = free_.erase(it);
  }
}

Storage::~Storage() {
  std::vector<StreamPoint> points;
  if (home) points.push_back({home, home->enqueued.load(std::memory_order_acquire)});
  for (auto& u : users_) points.push_back({u, u->enqueued.load(std::memory_order_acquire)});
  alloc->deallocate(ptr, bytes, std::move(points));
}

void Storage::record_stream(const std::shared_ptr<const StreamClock>& s) {
  if (!s || s == home) return;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& u : users_)
    if (u == s) return;
  users_.push_back(s);
}

}  // namespace d2l
