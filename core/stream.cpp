#include "core/stream.hpp"

namespace d2l {

// done only grows: the host's fence (synchronize) and the stream's thread may both advance it.
static void advance(std::atomic<uint64_t>& done, uint64_t to) {
  uint64_t cur = done.load(std::memory_order_relaxed);
  while (cur < to && !done.compare_exchange_weak(cur, to, std::memory_order_release, std::memory_order_relaxed)) {
  }
}

void EventState::complete() {
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_all();
}

void EventState::wait() {
  std::unique_lock<std::mutex> lock(mu);
  cv.wait(lock, [&] { return done; });
}

bool Event::query() const {
  if (!state_) return true;
  std::lock_guard<std::mutex> lock(state_->mu);
  return state_->done;
}

void Event::synchronize() const {
  if (state_) state_->wait();
}

Stream::Stream(std::string name, StreamHooks hooks)
    : name_(std::move(name)), lane_(trace::lane_of(name_)), hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { loop(); });
}

Stream::~Stream() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void Stream::enqueue(const char* op, std::function<void()> fn) {
  push(Task{op, std::move(fn), lane_.valid ? trace::capture() : nullptr, /*work=*/true});
}

void Stream::enqueue_untraced(const char* op, std::function<void()> fn) { push(Task{op, std::move(fn), nullptr}); }

// record() and wait() push directly: their tasks are not in the trace (waiting is idle time).
void Stream::push(Task task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(task));
    clock_->enqueued.fetch_add(1, std::memory_order_release);
  }
  cv_.notify_one();
}

void Stream::record(Event& e) {
  auto state = std::make_shared<EventState>();
  e.state_ = state;
  if (!hooks_.fence) return push(Task{"record event", [state] { state->complete(); }, nullptr});
  push(Task{"record event", [this, state] {
    try {
      hooks_.fence();
    } catch (...) {
      state->complete();  // a failed device still releases its waiters; the error surfaces at sync
      throw;
    }
    fenced_ = true;
    state->complete();
  }, nullptr});
}

void Stream::wait(const Event& e) {
  if (!e.state_) return;  // never recorded: nothing to wait for, as in CUDA
  auto state = e.state_;
  push(Task{"wait event", [state] { state->wait(); }, nullptr});
}

void Stream::synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  idle_.wait(lock, [&] { return queue_.empty() && !busy_; });
  if (hooks_.fence && error_.empty()) {
    // The GPU fence can take as long as the queued kernels: not under the lock, so other threads
    // may enqueue meanwhile (what they add is not waited for, as with cudaStreamSynchronize).
    const uint64_t run = clock_->run.load(std::memory_order_acquire);
    lock.unlock();
    std::string err;
    try {
      hooks_.fence();  // everything run so far has its work complete
      advance(clock_->done, run);
    } catch (const std::exception& ex) {
      err = std::string("synchronize on ") + name_.substr(0, name_.find(' ')) + ": " + ex.what();
    }
    lock.lock();
    if (!err.empty() && error_.empty()) error_ = err;
  }
  if (!error_.empty()) {
    std::string msg = std::move(error_);
    error_.clear();
    throw DeviceError(msg);
  }
}

void Stream::loop() {
  if (hooks_.on_thread_start) {
    try {
      hooks_.on_thread_start();
    } catch (const std::exception& ex) {
      std::lock_guard<std::mutex> lock(mu_);
      error_ = "starting " + name_ + ": " + ex.what();
    }
  }
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and drained
      task = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::string err;
    trace::Clock::time_point started;
    if (task.traced) started = trace::Clock::now();
    try {
      if (!(task.work && work_cancelled())) task.fn();
      if (task.traced && hooks_.fence) {  // gpu(i): the record ends when the GPU is done
        hooks_.fence();
        fenced_ = true;
      }
    } catch (const std::exception& ex) {
      err = std::string(task.op) + " on " + name_.substr(0, name_.find(' ')) + ": " + ex.what();
    } catch (...) {
      err = std::string(task.op) + " on " + name_.substr(0, name_.find(' ')) + ": unknown error";
    }
    if (task.traced) trace::finish(lane_, task.op, *task.traced, started, trace::Clock::now());
    task.fn = nullptr;  // drop what the task held (storage returns to the allocator) before idling
    const uint64_t run = clock_->run.fetch_add(1, std::memory_order_acq_rel) + 1;
    if (!hooks_.fence || fenced_) advance(clock_->done, run);
    fenced_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!err.empty() && error_.empty()) error_ = err;
      busy_ = false;
      if (queue_.empty()) idle_.notify_all();
    }
  }
}

}  // namespace d2l
