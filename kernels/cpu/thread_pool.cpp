#include "kernels/cpu/thread_pool.hpp"

#include <algorithm>

namespace d2l::kernels::cpu {

ThreadPool::ThreadPool(int helpers) {
  for (int i = 0; i < helpers; ++i) threads_.emplace_back([this, i] { loop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::loop(int id) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      if (id >= count_) continue;  // not needed this round
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(id);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (err && !error_) error_ = err;
    if (--pending_ == 0) done_.notify_all();
  }
}

void ThreadPool::run(int count, const std::function<void(int)>& job) {
  count = std::min(count, helpers() + 1);
  if (count <= 1) {
    if (count == 1) job(0);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &job;
    count_ = count;
    pending_ = count - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr err;
  try {
    job(0);
  } catch (...) {
    err = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mu_);
  done_.wait(lock, [&] { return pending_ == 0; });
  if (!err) err = error_;
  job_ = nullptr;
  if (err) std::rethrow_exception(err);
}

void Ctx::parallel_for(int64_t n, const std::function<void(int64_t, int64_t)>& fn) const {
  if (n <= 0) return;
  int64_t parts = std::min<int64_t>(n, pool ? std::min(threads, pool->helpers() + 1) : 1);
  if (parts <= 1) {
    fn(0, n);
    return;
  }
  pool->run(static_cast<int>(parts), [&](int i) {
    int64_t begin = n * i / parts, end = n * (i + 1) / parts;
    if (begin < end) fn(begin, end);
  });
}

}  // namespace d2l::kernels::cpu
