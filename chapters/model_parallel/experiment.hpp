// The section's experiment (PyTorch's model-parallel tutorial, Steps 3-5): train(model) on random images, timed like
// timeit.repeat(stmt, setup, number=1, repeat=10) for the model-parallel ResNet-50, the single-device
// one and the pipelined one, the bar plots mp_vs_rn.png and mp_vs_rn_vs_pp.png, and the split-size
// sweep split_size_tradeoff.png with the best split size. Beyond the section: the memory each device
// holds per model, and a timeline of one pipelined step with each device's idle fraction.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "chapters/model_parallel/pipeline_resnet50.hpp"

namespace d2l::mp {

struct Config {
  std::vector<Device> devices{cpu(0), cpu(1)};  // model parallel: the first 2; pipelined: the first `stages`
  // The section's training configuration: num_batches, batch_size, image_w = image_h, num_classes.
  int64_t num_batches = 3, batch_size = 120, image_size = 128, num_classes = 1000;
  int repeat = 10;                               // num_repeat (timeit's number is 1)
  int64_t split_size = 20;                       // PipelineParallelResNet50(split_size=20)
  std::vector<int64_t> sweep{1, 3, 5, 8, 10, 12, 20, 40, 60};  // split_sizes of Step 5
  size_t stages = 2;                             // pipeline stages (K devices)
  pipeline::Schedule schedule = pipeline::Schedule::gpipe;
  // Recomputation: torchgpipe's names; never by default, as the section (README: why not except_last).
  pipeline::Checkpoint checkpoint = pipeline::Checkpoint::never;
  bool memory_sweep = true;                      // memory_vs_microbatches (report.hpp)
  std::vector<size_t> partition;                 // stage starts in the 22 blocks; empty: default_partition
  bool balance = false;                          // cut by each block's measured time instead
  std::string out_dir = ".";                     // the four PNGs go here; "" draws none
  std::string trace_file;                        // Chrome-trace JSON of one pipelined step; "" for none
  uint64_t seed = 0;
  // --precision bf16 / fp16: steps 3 to 5 (each training step, the memory sweep, the traces) under Autocast,
  // fp16's training with a GradScaler
  DType autocast = DType::f32;
  bool verbose = true;
};

// Sizes for a machine without a GPU, where a CPU device is one to two orders of magnitude slower
// than the section's GPUs: batch 32 of 3x64x64, repeat 5, sweep 1, 2, 4, 8, 16 (the section's sweep
// ends at half the batch too), and split size 16, the sweep's fastest here (CPU convolutions lose
// efficiency on small micro-batches); the whole program then takes about 4 minutes on 2 cores.
void make_cpu_defaults(Config& cfg);
// --quick: tiny sizes, seconds on a CPU: batch 8 of 3x32x32, 10 classes, 1 batch, repeat 2, split
// size 4, sweep 2, 4, 8. (The section's own sizes are Config's defaults above; main's --help and its
// CPU-sized note read all three from here.)
void make_quick(Config& cfg);
// "1,3,5" (a --sweep)
std::string sweep_text(const std::vector<int64_t>& sweep);

// Checks the configuration: a ConfigError naming the flag (--split-size < 1 or > --batch-size, a
// sweep value < 1, --stages < 2 or above the device count, fewer than 2 devices, sizes < 1, an
// image smaller than 32, a --partition of the wrong length, an unwritable --trace path or --out-dir).
void validate(const Config& cfg);
// Whether every micro-batch of split_size rows can train: ResNet-50 halves the image five times, so
// up to 32x32 layer4's maps are 1x1 and BatchNorm (as PyTorch's) needs at least 2 images per
// micro-batch to have more than one value per channel. Sweep values that do not fit are skipped.
bool fits_batch_norm(const Config& cfg, int64_t split_size);

// The section's train(model): num_batches steps, each with a fresh batch of random inputs
// (N(0, 1), on input_device) and one-hot labels (indices drawn once per call), MSELoss and SGD
// lr 0.001. A PipelineParallelResNet50 runs its schedule (forward_backward); any other model runs
// forward, then backward. The host waits for each batch before the next, so it returns when every
// device is done.
void train(ResNet& model, Device input_device, const Config& cfg);

// timeit.repeat(number=1, repeat=cfg.repeat): the wall time of each train(model), their mean and
// (population) standard deviation, as np.mean / np.std.
struct Timing {
  std::vector<double> runs;
  double mean = 0, std = 0;
};
Timing time_train(ResNet& model, Device input_device, const Config& cfg);

// What each device's allocator saw while a model trained: the bytes of its parameters (with
// gradients and BatchNorm statistics: everything in use before the step) and the peak.
struct DeviceMemory {
  Device device;
  int64_t parameters = 0;  // parameter values and running statistics placed on the device
  int64_t before = 0;      // bytes in use before train(): parameters, gradients, anything left
  int64_t peak = 0;        // peak bytes in use during train()
};

struct Result {
  Timing mp, rn, pp;                       // Model Parallel, Single GPU, Pipelining Model Parallel
  std::vector<int64_t> sweep;              // split sizes timed (those <= batch_size)
  std::vector<Timing> sweep_times;
  int64_t best_split = 0;                  // the sweep's fastest
  std::vector<DeviceMemory> mem_mp, mem_rn, mem_pp;
  std::vector<double> idle;                // per pipeline device, from the trace (when traced)
  double bubble = 0;                       // the schedule's formula for the traced step
  struct MemoryPoint {                     // memory_vs_microbatches (report.hpp)
    pipeline::Schedule schedule;
    pipeline::Checkpoint checkpoint;
    size_t M = 0;
    std::vector<int64_t> peak;             // per stage device: peak bytes in use minus those before
    double seconds = 0;                    // the step's wall time
  };
  std::vector<MemoryPoint> memory;
  struct ScheduleIdle {                    // trace_step: each schedule's traced step
    pipeline::Schedule schedule;
    std::vector<double> idle;              // per stage device
    double formula = 0;
  };
  std::vector<ScheduleIdle> schedule_idle;
  std::string partition;                   // the pipeline's cut, printed
  std::vector<std::string> plots;          // PNGs written
};

// The whole experiment, printing as it goes (when verbose).
Result run(const Config& cfg);

}  // namespace d2l::mp
