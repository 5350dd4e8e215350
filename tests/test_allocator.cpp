// The caching allocator: freed blocks are reused without a system allocation; peak is exact.
#include <doctest/doctest.h>

#include <algorithm>
#include <future>
#include <vector>

#include "core/allocator.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "kernels/cpu/kernels.hpp"

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

// Holds a stream until open() (or the end of the scope): work queued behind it cannot have run.
struct Gate {
  std::promise<void> go;
  std::shared_future<void> opened = go.get_future().share();
  bool open_ = false;
  explicit Gate(Stream& s) {
    s.enqueue_untraced("test gate", [f = opened] { f.wait(); });
  }
  void open() {
    if (!open_) go.set_value(), open_ = true;
  }
  ~Gate() { open(); }
};

static bool all_equal(const Tensor& t, float v) {
  for (float x : t.to_vector())
    if (x != v) return false;
  return true;
}

// Each case below uses a shape more than twice the size of the one before: no block of another case
// can serve its requests, so the pool's blocks that fit are its own.
#define CASE_SHAPE(rows, cols)      \
  const Shape kShape{rows, cols};   \
  const size_t kBytes = rows * cols * 4

TEST_CASE("same stream: a block the host lets go is reused at once, and the queued reader still sees its data") {
  CASE_SHAPE(97, 131);
  Device d = cpu(0);
  waitall();
  auto& alloc = *runtime(d).allocator;
  Tensor y;
  {
    Gate gate(runtime(d).compute);
    Tensor x = Tensor::full(kShape, 1.0f, d);
    const void* px = x.data();
    y = scale(x, 2.0f);  // queued behind the gate: reads x later
    const int64_t before = alloc.stats().in_use;
    x = Tensor();  // the host lets go; the scale has not run
    CHECK(alloc.stats().in_use == before - static_cast<int64_t>(kBytes));
    Tensor z = Tensor::full(kShape, 5.0f, d);  // for the same stream: x's block at once
    CHECK(z.data() == px);
    gate.open();
    CHECK(all_equal(y, 2.0f));  // the scale read x before the fill of z overwrote it
    CHECK(all_equal(z, 5.0f));
  }
  waitall();
}

TEST_CASE("another stream gets a freed block only once the work queued on its own stream is done") {
  CASE_SHAPE(160, 240);
  Device d = cpu(0);
  waitall();
  auto& alloc = *runtime(d).allocator;
  Stream other("test other");
  void* q = nullptr;
  const void* px = nullptr;
  Tensor y;
  {
    Tensor x = Tensor::full(kShape, 1.0f, d);
    px = x.data();
    waitall();  // x holds its ones before the gate
    Gate gate(runtime(d).compute);
    y = scale(x, 2.0f);
    x = Tensor();
    q = alloc.allocate(kBytes, {other.clock().get()});  // the scale still has to read x's block
    CHECK(q != px);
    other.enqueue_untraced("write 7", [q] { std::fill_n(static_cast<float*>(q), kBytes / 4, 7.0f); });
    other.synchronize();  // the other stream does not wait for the gate
    gate.open();
    CHECK(all_equal(y, 2.0f));  // 14 if `other` had been handed x's block
  }
  waitall();
  alloc.deallocate(q, kBytes, {other.point()});
  other.synchronize();
  void* again = alloc.allocate(kBytes, {other.clock().get()});  // the scale has run: free for anyone
  CHECK((again == px || again == q));
  alloc.deallocate(again, kBytes, {other.point()});
}

TEST_CASE("record_stream: a block read by another stream is not reused before that stream is done") {
  CASE_SHAPE(280, 410);
  Device d = cpu(0);
  waitall();
  Stream reader("test reader");
  std::vector<float> seen(kBytes / 4, 0.0f);
  {
    Gate gate(reader);
    Tensor x = Tensor::full(kShape, 1.0f, d);
    const float* px = x.data();
    x.storage()->record_stream(reader.clock());  // the reader uses x without holding it
    Event filled;
    runtime(d).compute.record(filled);
    reader.wait(filled);
    reader.enqueue_untraced("read x", [px, &seen] { std::copy_n(px, seen.size(), seen.begin()); });
    x = Tensor();
    Tensor z = Tensor::full(kShape, 5.0f, d);  // same stream as x, but the reader is still queued
    CHECK(z.data() != px);
    runtime(d).compute.synchronize();  // z's fill has run; the reader has not
    gate.open();
    reader.synchronize();
  }
  CHECK(std::all_of(seen.begin(), seen.end(), [](float v) { return v == 1.0f; }));  // 5 if x's block went to z
  waitall();
}

TEST_CASE("a kernel's scratch never takes a block whose queued readers come after the running task") {
  CASE_SHAPE(500, 690);
  Device d = cpu(0);
  waitall();
  auto& rt = runtime(d);
  Tensor y;
  const void* taken = nullptr;
  const void* px = nullptr;
  {
    Gate gate(rt.compute);
    Tensor x = Tensor::full(kShape, 1.0f, d);
    px = x.data();
    // A task between x's fill and its reader asks for scratch, as conv2d does, and writes it.
    rt.compute.enqueue_untraced("scratch user", [&rt, &taken] {
      void* p = rt.workspace.get(kBytes);
      std::fill_n(static_cast<float*>(p), kBytes / 4, 9.0f);
      taken = p;
      rt.workspace.put(p, kBytes);
    });
    y = scale(x, 2.0f);
    x = Tensor();  // freed before the scratch user runs
    gate.open();
    CHECK(all_equal(y, 2.0f));  // 18 if the scratch had been x's block
  }
  CHECK(taken != px);
  waitall();
}

TEST_CASE("peak memory counts the scratch buffers of convolutions (cpu and emulated GPU)") {
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::im2col);  // the member with an im2col buffer
  for (Device d : {cpu(0), emu(0)}) {
    CAPTURE(d.str());
    waitall();
    auto& alloc = *runtime(d).allocator;
    Tensor x = Tensor::full({2, 3, 16, 16}, 0.5f, d), w = Tensor::full({4, 3, 3, 3}, 0.1f, d);
    Tensor b = Tensor::zeros({4}, d);
    waitall();
    alloc.reset_peak();
    const int64_t base = alloc.stats().in_use;
    Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
    waitall();
    // The im2col buffer of one image: (C*KH*KW) x (OH*OW) floats, alive while the kernel runs.
    const int64_t col = 3 * 3 * 3 * 16 * 16 * 4, out = 2 * 4 * 16 * 16 * 4;
    CHECK(alloc.stats().peak >= base + out + col);
    CHECK(alloc.stats().in_use == base + out);  // and returned when it ends
  }
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::automatic);  // the default
}
