// Streams and events (docs/devices-and-streams.md), CUDA's model on worker threads:
// a Stream runs its tasks one after another, in the order they were enqueued, on its own thread;
// the host thread only enqueues. An Event marks a point in a stream; another stream can wait for it.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "core/cancel.hpp"
#include "core/trace.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l {

struct EventState {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  void complete();
  void wait();
};

// Like cudaEvent_t: record() replaces the point it marks; waiting on an event never recorded is a no-op.
class Event {
 public:
  bool recorded() const { return state_ != nullptr; }
  bool query() const;        // true when the recorded point has been reached (or never recorded)
  void synchronize() const;  // host waits for the recorded point
 private:
  friend class Stream;
  std::shared_ptr<EventState> state_;
};

// How far a stream has come, shared with whoever needs to know it after the stream is gone (the
// caching allocator's blocks): `run` tasks have finished on the stream's thread, `done` tasks have
// finished their work (the same on CPU-backed streams; on a gpu(i) stream, what the last fence saw,
// since a task there only queues kernels on the CUDA stream).
struct StreamClock {
  std::atomic<uint64_t> enqueued{0}, run{0}, done{0};
};

// A point in a stream: "everything enqueued on it so far" (cheaper than an Event: no task is queued).
struct StreamPoint {
  std::shared_ptr<const StreamClock> clock;
  uint64_t seq = 0;
  bool reached() const { return clock->done.load(std::memory_order_acquire) >= seq; }  // its work is complete
  bool issued() const { return clock->run.load(std::memory_order_acquire) >= seq; }    // its tasks have run
};

// What a stream of a real GPU adds (core/runtime.cpp): its worker thread first makes the GPU current,
// and since a task only queues work on a CUDA stream, a fence waits for that work to finish before an
// event completes or synchronize() returns. CPU-backed streams have neither.
struct StreamHooks {
  std::function<void()> on_thread_start;
  std::function<void()> fence;
};

class Stream : NoCopy {
 public:
  explicit Stream(std::string name, StreamHooks hooks = {});  // name: "cpu(0) compute"
  ~Stream();

  // Runs fn on the stream's thread after everything enqueued before. `op` names it in errors and in
  // the trace (core/trace.hpp), which records the task while recording is on.
  void enqueue(const char* op, std::function<void()> fn);
  void enqueue_untraced(const char* op, std::function<void()> fn);  // housekeeping, never in the trace
  void record(Event& e);        // e now marks "everything enqueued so far on this stream"
  void wait(const Event& e);    // later tasks here start after e's point; no-op if e never recorded
  void synchronize();           // host waits until the queue is drained; rethrows a kept error
  const std::string& name() const { return name_; }
  uint64_t tasks_run() const { return clock_->run.load(); }
  StreamPoint point() const { return {clock_, clock_->enqueued.load(std::memory_order_acquire)}; }
  const std::shared_ptr<StreamClock>& clock() const { return clock_; }
  bool has_fence() const { return static_cast<bool>(hooks_.fence); }  // a gpu(i) stream

 private:
  struct Task {
    const char* op = nullptr;
    std::function<void()> fn;
    std::unique_ptr<trace::Pending> traced;  // null unless the trace was recording at enqueue
    bool work = false;  // enqueue()'s kernels and copies: skipped once cancel_queued_work() was called
  };
  void push(Task task);
  void loop();
  std::string name_;
  trace::Lane lane_;  // this stream's lane in the trace: its device and "compute" or "copy"
  StreamHooks hooks_;
  std::mutex mu_;
  std::condition_variable cv_, idle_;
  std::deque<Task> queue_;
  bool busy_ = false, stop_ = false;
  std::string error_;  // first error since the last synchronize
  std::shared_ptr<StreamClock> clock_ = std::make_shared<StreamClock>();
  bool fenced_ = false;  // the running task ran the fence: its work and everything before it is complete
  std::thread thread_;
};

}  // namespace d2l
