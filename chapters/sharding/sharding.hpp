// Chapter 5, sharding: what data parallelism stores N times, and how to store it once.
//
//   zero_memory      ZeRO stages 1 to 3 (Rajbhandari et al., SC20): the same Adam training with
//                    the optimizer state replicated (stage 0, DDP), sharded (stage 1), sharded with
//                    the gradients reduce-scattered (stage 2), and with the parameters sharded too
//                    (stage 3, FSDP) on N = 1, 2, 4 devices; the bytes each device keeps, its peak and
//                    what it sends against the paper's formulas, the time of a step, and whether the
//                    sharded runs' parameters equal the replicated run's.
//   zero_processes   under mpirun with W > 1 ranks: the same runs with the shards over the ranks,
//                    one device each (core/optim/zero.hpp, every stage),
//                    a row per rank.
//   hybrid           under mpirun with several devices a rank: ZeRO-1 and ZeRO-2 sharded over the
//                    ranks or over each process's devices (FSDP's HYBRID_SHARD), a row per device.
//   tensor_parallel  Megatron-LM's MLP (Shoeybi et al. 2019): a classifier whose hidden MLP is split
//                    over P devices (column-parallel -> relu -> row-parallel), trained beside the
//                    same classifier unsharded on one device; loss and accuracy per epoch of both,
//                    and the bytes f and g send per step against 2 * batch * d_model * 4.
//   grid             the same classifier over processes, dp x tp (mpirun -np 4: 2 x 2): the MLP
//                    split over each tp group, the batch over the dp groups, against the unsharded
//                    run of one process.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/tensor.hpp"
#include "datasets/data_iter.hpp"

namespace d2l::nn {
class Block;
class Sequential;
}
namespace d2l::optim {
class Trainer;
}

namespace d2l::sharding {

struct Config {
  std::vector<Device> devices;         // --devices / --num-gpus; runs use a prefix of them
  std::string data_dir;                // Fashion-MNIST (resolve_data_dir's order when "")
  std::optional<ArrayDataset> train_data, test_data;  // generated (--quick) or Fashion-MNIST: load_data
  int64_t batch_size = 256;
  uint64_t seed = 0;
  // Part 1: ZeRO.
  int zero_stage = 3;      // the last stage run beside the replicated one (0: the replicated rows only)
  int steps = 20;          // timed Adam steps per run (after one untimed warm-up step)
  float adam_lr = 1e-3f;
  double reduce_bucket_mb = 0.5;  // under mpirun: ZeRO-2's reduce-scatter bucket (0: one per parameter)
  float clip_grad_norm = 0;  // part 1 and the grid: clip_grad_norm_'s max_norm over every shard and slice (0: off)
  // The MLP of part 1: 784 -> zero_hidden, then zero_layers - 1 more Dense(zero_hidden) layers, -> 10:
  // layers of equal width, so that the units FSDP gathers are of similar size and the optimizer's
  // bytes dominate (ZeRO's ladder shows; exercise 3 in README.md makes the first layer dominate).
  int64_t zero_hidden = 512;
  int zero_layers = 8;
  // Part 2: tensor parallelism.
  int tp_size = 2;         // P, the devices the Megatron MLP is split over
  int64_t d_model = 64;    // the MLP's input and output width
  int64_t hidden = 256;    // its hidden width (4 d_model), split over P
  float lr = 0.1f;         // SGD's
  // The grid: where its SGD state lives over each dp group (0 replicated, 1 ZeRO-1, 2 ZeRO-2).
  int grid_zero_stage = 1;
  // --precision bf16 / fp16: part 1's and the grid's steps under Autocast (fp16 with a GradScaler)
  DType autocast = DType::f32;
  int num_epochs = 3;
  bool verbose = true;
  std::string plot_dir;    // part 1: memory_per_device.png and step_time.png here ("" for none)
  std::string trace_file;  // part 1: one ZeRO-3 step on the most devices, Chrome-trace JSON ("" for none)
  std::string save_dir;    // part 1: its last run as a sharded checkpoint (checkpoint.cpp; "" for none)
  std::string load_dir;    // part 1: every run starts from this sharded checkpoint ("" for the seed's initialization)
};

// The relative difference rounding may leave between two runs that compute the same thing in
// another order (the checks' "equal within rounding"): float32's 1e-5; under autocast (--precision
// bf16 / fp16), whose products round to 16 bits, ten of the type's unit roundoffs (2^-9 and 2^-12).
double rounding_tolerance(DType autocast);

// Generated 28x28 images in place of Fashion-MNIST, a few steps: seconds on two cores.
void make_quick(Config& cfg);
// The flags against each other (one ConfigError line naming the flag), before any work.
void validate(const Config& cfg);
// The training and test sets, before any work: the generated ones (--quick) or Fashion-MNIST read into
// train_data and test_data (a ConfigError naming the directory when it is missing or empty).
void load_data(Config& cfg);
// Each part's own flags, checked only when the part runs (one ConfigError line naming the flag):
// part 1 (the stage; as one process, `processes` = 1: a batch every device gets a part of, devices of
// one kind, --trace only with a ZeRO-3 run), part 2 (--tp-size against the devices and --hidden).
void validate_memory(const Config& cfg, int processes);
void validate_tp(const Config& cfg);
// Part 1 as one process, or its hybrid runs over `processes` ranks of several devices each, after
// load_data: a short last minibatch that the steps reach must still give every device an example.
void validate_short_batch(const Config& cfg, int processes = 1);
// The bytes part 2 (grid = false) or the grid over `processes` needs for its nets and a minibatch's
// activations, for d2l::require_memory_of before any of them is allocated.
double classifier_bytes(const Config& cfg, int64_t features, int processes, bool grid);

// ---- Part 1
// A device's bytes, measured after the last step from the buffers its allocator handed out, by what
// they hold (core/allocator.hpp's MemoryTag), beside the ZeRO paper's model of them.
struct MemoryRow {
  int n = 1;           // devices
  int stage = 0;       // zero_stage
  Device device;
  int64_t parameter_bytes = 0, gradient_bytes = 0, state_bytes = 0;  // tags parameters, gradients, optimizer_state
  int64_t summed_gradient_bytes = 0;          // tag summed_gradients: a sum kept apart from the .grad buffers
  int64_t gathered_bytes = 0;                 // tag gathered: ZeRO-3's units still whole (0 between steps)
  int64_t formula_gradient_bytes = 0;         // the .grad buffers: 4 Psi at stages 0 and 1, 0 at 2 and 3
  int64_t formula_parameter_bytes = 0;        // 4 Psi; 4 Psi_i at stage 3
  int64_t formula_state_bytes = 0;            // 8 Psi replicated; 8 Psi_i at stages 1 to 3
  int64_t formula_summed_gradient_bytes = 0;  // 0 at stages 0 and 1 (the sum is written into .grad); 4 Psi_i at 2 and 3
  int64_t peak_bytes = 0;                     // the allocator's peak on the device over the timed steps
  int64_t peak_by_tag[6] = {};                // what that peak was made of, by MemoryTag
  int64_t sent_bytes = 0;                     // sent to other devices in one step (copy_counters)
};
struct ZeroRun {
  int n = 1, stage = 0;
  double seconds_per_step = 0;
  double final_loss = 0;            // the last step's mean loss
  std::vector<MemoryRow> rows;      // one per device
  double max_diff_to_replicated = -1;  // stages 1 to 3: largest |parameter difference| from stage 0 (-1: none)
  int64_t sent_bytes = 0;              // all devices together, one step
  int64_t trace_tasks = 0;             // the stream tasks of the step traced (--trace), 0 when none
  int64_t formula_sent_bytes = 0;      // 2(N-1) * 4 Psi at stages 0 to 2, 3(N-1) * 4 Psi at stage 3
  int64_t skipped = 0;                 // --precision fp16: timed steps the GradScaler skipped (stages 1, 2: no all-gather)
  std::vector<std::pair<std::string, int64_t>> saved;  // --save: the checkpoint's files and their bytes on disk
};
struct ZeroResult {
  int64_t psi = 0;  // trainable elements
  std::vector<ZeroRun> runs;
};
// Part 1 under mpirun with W > 1 ranks (zero_processes.cpp): stages 0 to 3 over the ranks, one device
// each (kvstore dist_sync), a row per rank; every rank's parameters against rank 0's, per run.
struct ZeroRanksResult {
  ZeroResult zero;
  std::vector<double> diff_to_rank0;
};
ZeroRanksResult zero_memory_over_ranks(const Config& cfg);
int print_zero_over_ranks(const Config& cfg, const ZeroRanksResult& r);
// Every rank's `mine` (the same count on each), rank r's in slots [r * n, (r + 1) * n): rank order (a collective).
std::vector<double> from_every_rank(const std::vector<double>& mine);
// The largest |a[e] - b[e]| (infinity when the sizes differ).
double largest_difference(const std::vector<float>& a, const std::vector<float>& b);
// Part 1 under mpirun with k > 1 devices a rank (hybrid.cpp): ZeRO-1 and ZeRO-2 with the shards over
// the ranks (a process's devices replicas) and over each process's devices (replicated over the
// ranks, ShardOver::devices) and over every device of every rank (ShardOver::all_devices), beside the
// replicated run; a row per device of every rank.
enum class HybridLayout { replicated, over_ranks, over_devices, over_all };
const char* hybrid_layout_name(HybridLayout l);
struct HybridRun {
  HybridLayout layout = HybridLayout::replicated;
  int stage = 0;
  std::vector<MemoryRow> rows;         // rank r's device i at r * k + i
  double max_diff_to_replicated = 0;   // every device of every rank, against the replicated run
  double max_diff_to_rank0 = 0;        // every rank's replicas against rank 0's
};
struct HybridResult {
  int ranks = 1, devices = 1;
  int64_t psi = 0;
  std::vector<HybridRun> runs;  // replicated, then per stage over the ranks and over the devices
};
HybridResult hybrid_over_ranks(const Config& cfg);
int print_hybrid(const Config& cfg, const HybridResult& r);
// Part 1's net: flatten -> Dense(zero_hidden, relu) x zero_layers -> Dense(10) (zero_memory.cpp).
std::shared_ptr<nn::Sequential> zero_mlp(int64_t features, const Config& cfg);
// n elements split k ways: part i's size (the one split rule, core/comm.hpp's chunk_begin).
int64_t part_of(int64_t n, int64_t i, int64_t k);
// Psi'_i: what holder i of n keeps at stage 3, where each of the net's layers (FSDP's unit) is split
// over the holders by itself: shard i of each layer's Psi_u (core/comm.hpp's chunk_begin), added up.
int64_t unit_shard(const nn::Sequential& net, int64_t i, int64_t n);
// The device counts of part 1: 1, 2, 4, ... up to the devices given, and their number.
std::vector<int> zero_device_counts(size_t available);
ZeroResult zero_memory(const Config& cfg);
// --save: the run as a sharded checkpoint in cfg.save_dir (every rank calls it), the files' sizes into run.saved.
void save_run(const Config& cfg, const nn::Block& net, const optim::Trainer& trainer, ZeroRun& run);
// --load: the checkpoint's parameters and state into a run's net and Trainer (every rank calls it).
void load_run(const Config& cfg, nn::Block& net, optim::Trainer& trainer);
// The plots of part 1 into cfg.plot_dir (--out-dir): memory and step time against N (kMemoryPlot,
// kStepTimePlot) and, at the largest N, what a device holds at its peak per stage (kHeldPlot, the
// ZeRO paper's Figure 1); a line per plot, naming it or saying why it could not be drawn.
inline constexpr const char* kMemoryPlot = "zero_memory.png";
inline constexpr const char* kStepTimePlot = "zero_step_time.png";
inline constexpr const char* kHeldPlot = "zero_held.png";
void plot_zero(const Config& cfg, const ZeroResult& r);

// ---- Part 2
struct EpochRow {
  double loss = 0, train_acc = 0, test_acc = 0;
};
struct TensorParallelResult {
  std::vector<EpochRow> unsharded, sharded;
  std::vector<double> unsharded_steps, sharded_steps;  // every step's mean loss
  std::vector<double> unsharded_norms, sharded_norms;  // every step's gradient norm (--clip-grad-norm > 0)
  int64_t step_batch = 0;              // the examples of the step whose traffic was counted
  int64_t allreduces_per_step = 0, bytes_per_step = 0;  // tp::traffic() over that step
  int64_t formula_bytes_per_step = 0;  // 2 * step_batch * d_model * 4
  double max_output_diff = 0;          // largest |logit difference| over the test set after training
};
TensorParallelResult tensor_parallel(const Config& cfg);

// ---- Part 3 (grid.cpp): tp_size processes per tp group, world_size() / tp_size dp groups.
// --tp-size against the processes, --hidden and --batch-size against the grid: one CollectiveError line.
void validate_grid(const Config& cfg);
std::string grid_devices(const Config& cfg);  // "4 processes, one device each (rank r: ...)"
// Runs the grid and the unsharded run, prints the mapping, losses and check lines; returns the
// number of failed checks (the same on every rank).
int grid_over_processes(const Config& cfg);

}  // namespace d2l::sharding
