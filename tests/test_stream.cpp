// Streams really run in parallel across devices, in order within a stream, and events order work
// across devices (docs/devices-and-streams.md). Timing only bounds a wait (a deadline), never asserts speed.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <thread>

#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using namespace std::chrono_literals;

TEST_CASE("tasks on cpu(0) and cpu(1) meet at a rendezvous: the devices run at the same time") {
  use_devices({cpu(0), cpu(1)});
  std::atomic<int> arrived{0};
  std::atomic<bool> met0{false}, met1{false};
  auto meet = [&](std::atomic<bool>& met) {
    arrived.fetch_add(1);
    auto deadline = std::chrono::steady_clock::now() + 10s;
    while (arrived.load() < 2 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
    met = arrived.load() == 2;  // false if the other device only starts after this one finishes
  };
  launch(cpu(0), "rendezvous", {}, [&](const LaunchCtx&) { meet(met0); });
  launch(cpu(1), "rendezvous", {}, [&](const LaunchCtx&) { meet(met1); });
  waitall();
  CHECK(met0);
  CHECK(met1);
}

// b waits on an event recorded on a behind a held-back task (CPU devices and emulated GPUs alike).
static void check_event_wait(Device a, Device b) {
  use_devices({a, b});
  std::promise<void> gate;
  std::shared_future<void> open = gate.get_future().share();
  std::atomic<bool> released{false}, ran_early{false}, ran{false};
  launch(a, "held back", {}, [&](const LaunchCtx&) {
    open.wait();
    released = true;
  });
  Event e;
  runtime(a).compute.record(e);
  runtime(b).compute.wait(e);
  launch(b, "after event", {}, [&](const LaunchCtx&) {
    ran_early = !released.load();
    ran = true;
  });
  std::this_thread::sleep_for(100ms);
  CHECK_FALSE(ran.load());   // still blocked behind the held-back task
  CHECK_FALSE(e.query());
  gate.set_value();
  waitall();
  CHECK(ran.load());
  CHECK_FALSE(ran_early.load());
  CHECK(e.query());
}

TEST_CASE("device 1 waits on an event recorded on device 0 behind a held-back task") {
  SUBCASE("cpu(0) -> cpu(1)") { check_event_wait(cpu(0), cpu(1)); }
  SUBCASE("emu(0) -> emu(1)") { check_event_wait(emu(0), emu(1)); }
  SUBCASE("cpu(0) -> emu(2)") { check_event_wait(cpu(0), emu(2)); }
}

TEST_CASE("waiting on an event never recorded does not block") {
  Event never;
  CHECK_FALSE(never.recorded());
  runtime(cpu(1)).compute.wait(never);
  std::atomic<bool> ran{false};
  launch(cpu(1), "after", {}, [&](const LaunchCtx&) { ran = true; });
  auto done = std::async(std::launch::async, [] { runtime(cpu(1)).compute.synchronize(); });
  REQUIRE(done.wait_for(10s) == std::future_status::ready);
  CHECK(ran.load());
}

TEST_CASE("within a stream, tasks run in the order they were enqueued") {
  std::vector<int> seen;
  for (int i = 0; i < 50; ++i) launch(cpu(0), "ordered", {}, [&seen, i](const LaunchCtx&) { seen.push_back(i); });
  waitall();
  REQUIRE(seen.size() == 50);
  for (int i = 0; i < 50; ++i) CHECK(seen[i] == i);
}

TEST_CASE("an exception inside a stream surfaces at the next sync, naming the op and the device") {
  launch(cpu(1), "exploding_kernel", {}, [](const LaunchCtx&) { throw std::runtime_error("bad value"); });
  CHECK_THROWS_WITH_AS(waitall(), "exploding_kernel on cpu(1): bad value", DeviceError);
  waitall();  // the error was reported once; the device keeps working
  // The same through an op: a label out of range is found by the kernel, on the device.
  Tensor logits = Tensor::zeros({2, 3}, cpu(1));
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 7}, {2}, cpu(1));
  Tensor l = softmax_cross_entropy(logits, labels);
  CHECK_THROWS_WITH_AS(l.item(), doctest::Contains("softmax_cross_entropy on cpu(1): label 7"), DeviceError);
}

TEST_CASE("copies between devices are ordered after the producer and before the consumer") {
  use_devices({cpu(0), cpu(1)});
  for (int round = 0; round < 20; ++round) {
    Tensor a = Tensor::full({1000}, static_cast<float>(round), cpu(0));
    Tensor b = add(a, a).to(cpu(1));  // produced on cpu(0), copied on cpu(1)'s copy stream
    Tensor c = add(b, b);             // consumed on cpu(1)
    fill_(a, -1.0f);                  // a later write on cpu(0) must not race the copy of add(a, a)
    auto v = c.to_vector();
    CHECK(v.front() == 4.0f * round);
    CHECK(v.back() == 4.0f * round);
  }
}

// The hooks a gpu(i) stream uses (core/runtime.cpp), checked with stand-ins: a GPU task only queues
// work, so an event may complete, and synchronize() return, only after the fence has waited for it.
TEST_CASE("stream hooks: the thread-start hook runs on the worker; events and sync wait for the fence") {
  std::atomic<int> fences{0};
  std::atomic<bool> queued_work_done{false};
  std::thread::id worker;
  Stream s("gpu-like(0) compute",
           StreamHooks{[&] { worker = std::this_thread::get_id(); },
                       [&] {
                         std::this_thread::sleep_for(20ms);  // the "GPU" finishes what the tasks queued
                         queued_work_done = true;
                         fences.fetch_add(1);
                       }});
  s.enqueue("queue work", [] {});
  Event e;
  s.record(e);
  e.synchronize();
  CHECK(queued_work_done.load());  // without the fence the event would complete at once
  CHECK(fences.load() == 1);
  s.synchronize();
  CHECK(fences.load() == 2);
  CHECK(worker != std::thread::id{});
  CHECK(worker != std::this_thread::get_id());
}

TEST_CASE("a failing fence still completes its event (no hang) and its error surfaces at sync") {
  Stream s("gpu-like(1) compute", StreamHooks{{}, [] { throw std::runtime_error("illegal address"); }});
  Event e;
  s.record(e);
  e.synchronize();  // returns: waiters are released
  CHECK_THROWS_WITH_AS(s.synchronize(), doctest::Contains("record event on gpu-like(1): illegal address"), DeviceError);
}
