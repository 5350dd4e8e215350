// What chapter 2's train() needs around the book's loop (run.cpp), so that train.cpp shows the loop
// alone: the checked config, the data, each CPU device's kernel threads, the processes of
// --kvstore dist_sync, the lines before the first epoch, --resume, --save-params. The progress line,
// the minibatches in flight and the checkpoint files are chapters/harness's.
#pragma once
#include <utility>
#include <vector>

#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/copy.hpp"

namespace d2l::concise {

// Per-device kernel threads for one run (--threads), the previous budget restored afterwards.
class ThreadBudget {
 public:
  ThreadBudget(const std::vector<Device>& devices, const std::vector<int>& threads);
  ~ThreadBudget();
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

 private:
  std::vector<std::pair<Device, int>> saved_;
};

class Run {
 public:
  // validate(cfg), the thread budget, train_iter and test_iter (each process's shards with
  // dist_sync), "running on: [...]" and the line of settings, the split weights (--balance measures).
  explicit Run(const Config& cfg);
  // The settings of the Result train() returns (devices, model, batch size, lr, split weights).
  Result result() const;
  // Before the first epoch: --resume (the epoch it was written after, else 0); with dist_sync, DDP's
  // gradient buckets on the trainer, and rank 0's parameters on every rank, checked bit for bit.
  int before_training(nn::Block& net, optim::Trainer& trainer);
  // After an epoch, with dist_sync: the loss summed over the processes, every rank taking rank 0's
  // BatchNorm statistics; then the test accuracy of the processes' shares. Unchanged otherwise.
  double loss_over_processes(double loss_sum, nn::Block& net);
  double accuracy_over_processes(double acc);
  // After the last epoch: --save-params (rank 0), "parameters saved to F".
  void save_params(const nn::Block& net);

  const Config& cfg;
  ThreadBudget budget;
  DataIter train_iter, test_iter;
  bool dist = false;   // dist_sync under mpirun
  int rank = 0;        // this process's (0 without dist_sync)
  bool speak = false;  // rank 0 of a verbose run prints
  std::vector<double> split_weights;
};

// Every shard's summed loss, read in stream order right after the step that computed it.
std::vector<HostValue> read_later(const std::vector<Tensor>& losses);

}  // namespace d2l::concise
