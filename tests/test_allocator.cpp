// The caching allocator: freed blocks are reused without a system allocation; peak is exact.
#include <doctest/doctest.h>

#include <future>

#include "core/allocator.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;

TEST_CASE("a freed block is reused with no new system allocation") {
  auto a = std::make_shared<Allocator>("test");
  void* p = a->allocate(4000);
  CHECK(a->stats().system_allocs == 1);
  a->deallocate(p, 4000);
  void* q = a->allocate(3900);  // same 256-byte block size
  CHECK(q == p);
  CHECK(a->stats().system_allocs == 1);
  CHECK(a->stats().reuses == 1);
  void* r = a->allocate(100000);  // does not fit: a new block
  CHECK(a->stats().system_allocs == 2);
  a->deallocate(q, 3900);
  a->deallocate(r, 100000);
  CHECK(a->stats().in_use == 0);
}

TEST_CASE("bytes in use and peak are exact") {
  auto a = std::make_shared<Allocator>("test");
  void* x = a->allocate(1000);
  void* y = a->allocate(24);
  CHECK(a->stats().in_use == 1024);
  a->deallocate(x, 1000);
  void* z = a->allocate(10);
  CHECK(a->stats().in_use == 34);
  CHECK(a->stats().peak == 1024);
  a->reset_peak();
  CHECK(a->stats().peak == 34);
  a->deallocate(y, 24);
  a->deallocate(z, 10);
}

TEST_CASE("tensors return memory only after the work that uses them has run") {
  Device d = cpu(0);
  waitall();
  auto& alloc = *runtime(d).allocator;
  int64_t base = alloc.stats().in_use;
  const int64_t bytes = 256 * 256 * 4;
  {
    // The compute stream is held by a task that waits for the test, so the add queued behind it
    // cannot have run when the tensors are released.
    std::promise<void> go;
    std::shared_future<void> gate = go.get_future().share();
    runtime(d).compute.enqueue("test_gate", [gate] { gate.wait(); });
    {
      Tensor t = Tensor::ones({256, 256}, d);
      Tensor u = add(t, t);
    }  // t and u released by the program, their work still queued
    CHECK(alloc.stats().in_use >= base + 2 * bytes);  // the queued tasks still hold both buffers
    go.set_value();
    waitall();
  }
  CHECK(alloc.stats().in_use == base);
  // The same shapes again: served from the cache.
  int64_t sys = alloc.stats().system_allocs;
  for (int i = 0; i < 5; ++i) {
    Tensor t = Tensor::ones({256, 256}, d);
    Tensor u = add(t, t);
    u.to_vector();
  }
  CHECK(alloc.stats().system_allocs == sys);
}
