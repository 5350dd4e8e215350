// "Step 4": PipelineParallelResNet50(split_size). The section splits each batch into micro-batches of
// split_size rows and, in a Python loop, runs seq1 on micro-batch i+1 while seq2 works on micro-batch
// i (asynchronous CUDA launches make the overlap). Here the same cut is a pipeline of core/pipeline
// stages: the host enqueues every stage's work on its device's stream in the order of a schedule
// (GPipe: all forwards, then all backwards; 1F1B: one forward, one backward), and the devices run
// it as soon as their inputs arrive. Beyond the section, the model runs on K >= 2 devices: its flat
// layer list (ResNet::layer_list(), 22 blocks) is cut at `starts`:
//   K = 2, no starts: the section's cut, {0, 11}: conv1 .. layer2 | layer3 .. fc (seq1 | seq2, fc)
//   K > 2, no starts: equal numbers of blocks per stage
//   given starts (--partition), or balanced by each block's measured time (--balance, balanced_partition).
// BatchNorm normalises each micro-batch with its own statistics, as the section's model does.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/model_parallel/model_parallel.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/pipeline/pipeline.hpp"

namespace d2l::mp {

class PipelineParallelResNet50 : public ModelParallelResNet50 {
 public:
  // devices: the K >= 2 stages' devices, in order. ConfigError for a bad split_size (< 1) or
  // partition (see set_partition).
  PipelineParallelResNet50(int64_t split_size, const std::vector<Device>& devices,
                           pipeline::Schedule schedule = pipeline::Schedule::gpipe, const std::vector<size_t>& starts = {},
                           int64_t num_classes = 1000);

  // The forward pass alone, pipelined: x (N, 3, H, W) anywhere -> (N, num_classes) on the last device
  // (torch.cat of the micro-batches' outputs). On 2 devices the section's own loop (s_next, s_prev);
  // on K > 2 core/pipeline's forward. ConfigError if split_size > N.
  Tensor forward(const Tensor& x) override;
  // One training step's forward and backward by the schedule, with PyTorch's MSELoss over the whole
  // batch (each micro-batch adds its share: sum of squares / numel of the batch). target (N,
  // num_classes) anywhere. Gradients accumulate into the parameters; returns the loss on the last
  // device (the value of mse(forward(x), target)). Backward runs from scaler.scale of each
  // micro-batch's share: the share itself, or (--precision fp16) the share times the loss scale.
  Tensor forward_backward(const Tensor& x, const Tensor& target,
                          const optim::GradScaler& scaler = optim::GradScaler({.enabled = false}));

  // Re-cuts the layer list at `starts` (size K, starting at 0, increasing, below 22) and moves each
  // stage to its device. ConfigError naming --partition otherwise.
  void set_partition(const std::vector<size_t>& starts);
  const std::vector<size_t>& partition() const { return starts_; }
  std::string partition_str() const;  // "conv1..layer2 on cpu(0) | layer3.0..fc on cpu(1)"

  std::vector<pipeline::Stage> stages;
  std::vector<Device> devices;
  int64_t split_size;
  pipeline::Schedule schedule;
  pipeline::Checkpoint checkpoint = pipeline::Checkpoint::never;  // recomputation (core/pipeline)

 private:
  std::vector<size_t> starts_;
};

// The default cut for K stages of `num_layers` blocks: the section's for K = 2 of ResNet-50's 22,
// equal block counts otherwise (the first stages get one more when it does not divide).
std::vector<size_t> default_partition(size_t K, size_t num_layers = 22);

// --balance: each block's forward + backward time measured on `device` with a sample batch (N, 3,
// H, W), and the cut that makes the slowest of K stages as fast as possible. The model's parameters
// are moved to `device` for the measurement and back by set_partition. Returns the starts and fills
// `costs` (seconds per block) when given.
std::vector<size_t> balanced_partition(PipelineParallelResNet50& model, const Tensor& sample, Device device, size_t K,
                                       std::vector<double>* costs = nullptr);

}  // namespace d2l::mp
