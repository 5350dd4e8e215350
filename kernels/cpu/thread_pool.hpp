// Helper threads of one CPU/emu device: the device's thread budget minus the stream thread that
// calls parallel_for. One caller at a time (the device's compute stream).
#pragma once
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::kernels::cpu {

class ThreadPool : NoCopy {
 public:
  explicit ThreadPool(int helpers);
  ~ThreadPool();

  int helpers() const { return static_cast<int>(threads_.size()); }
  // Runs job(i) for i in [0, count): i == 0 on the calling thread, i >= 1 on helper i-1.
  // count <= helpers() + 1. Rethrows the first exception after every job has finished.
  void run(int count, const std::function<void(int)>& job);

 private:
  void loop(int id);
  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  int count_ = 0, pending_ = 0;
  uint64_t generation_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace d2l::kernels::cpu
