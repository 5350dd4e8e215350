// Multi-GPU training from scratch (d2l "Multi-GPU Training", 13.5): LeNet as a function of a
// list of parameters, copied to every device (get_params), a minibatch split over the devices
// (split_batch), gradients summed with allreduce, and the same SGD step on every device.
#pragma once
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/dist/buckets.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/tensor.hpp"
#include "datasets/data_iter.hpp"

namespace d2l::scratch {

// "Initialize model parameters": W1 (20,1,3,3), b1, W2 (50,20,5,5), b2, W3 (800,128), b3,
// W4 (128,10), b4; weights N(0, 0.01), biases zero; on device d.
std::vector<Tensor> init_params(Device d);
// "Define the model": conv 20@3x3 -> relu -> avg pool 2 -> conv 50@5x5 -> relu -> avg pool 2 ->
// flatten -> dense 128 -> relu -> dense 10. X (N, 1, 28, 28) -> (N, 10).
// Exercise 5 (--activation): another activation in the three places of relu, e.g. sigmoid, LeNet's original.
using Activation = Tensor (*)(const Tensor&);
Tensor lenet(const Tensor& X, const std::vector<Tensor>& params, Activation activation = relu);
// --activation's name -> the op (core/nn/activation.hpp's table: relu, sigmoid); else a ConfigError.
Activation activation_by_name(const std::string& name);
// "Cross-entropy loss": per-example losses (N).
Tensor loss(const Tensor& y_hat, const Tensor& y);

// "Data synchronization": copies of params on `device`, each with a zero gradient attached.
std::vector<Tensor> get_params(const std::vector<Tensor>& params, Device device);
// The book's allreduce: sum into data[0]'s device, then copy the sum back into every data[i] in place.
void allreduce(const std::vector<Tensor>& data);

// "Data distribution": X and y split into shards as even as possible (sizes differ by at most
// one), shard i copied to devices[i]. A device may get an empty shard in a short last batch.
std::pair<std::vector<Tensor>, std::vector<Tensor>> split_batch(const Batch& batch, const std::vector<Device>& devices);
// Splits the rows of a host matrix (rows, cols) over the devices (the book's 4x5 example).
std::vector<Tensor> split_and_load(const std::vector<float>& data, int64_t rows, int64_t cols,
                                   const std::vector<Device>& devices);

// "Training": one minibatch on every device. Returns the summed loss (on devices[0]'s host copy,
// read later) as one detached tensor per device that had examples.
// allreduce_algorithm: "naive" (the book's) or "ring".
// dist_allreduce: "" sums over this process's devices only; "library" or "ring" (--dist) then sums
// across the processes too (core/dist: devices first, then processes); batch.size() is then the
// whole minibatch over every process.
// buckets (--dist with --bucket-mb >= 0, core/dist/buckets.hpp): DDP's gradient buckets do the
// summing instead, over this process's devices and then the processes, their allreduces launched
// during backward; the loop below only finishes them.
// autocast (--precision bf16 / fp16): each device's forward and backward under Autocast, its GEMMs
// and convolutions in 16 bits (core/ops.hpp). scaler (fp16): backward from each loss times the
// loss scale; after the allreduce the step divides the scale out of the learning rate, or is
// skipped (the gradients zeroed) when a summed gradient holds an inf or a NaN; then scaler.update().
// Returns each device's loss; *stepped (when given) says whether the step was taken.
std::vector<Tensor> train_batch(const Batch& batch, std::vector<std::vector<Tensor>>& device_params,
                                const std::vector<Device>& devices, float lr, const std::string& allreduce_algorithm,
                                const std::string& dist_allreduce = "", dist::Buckets* buckets = nullptr,
                                Activation activation = relu, DType autocast = DType::f32,
                                optim::GradScaler* scaler = nullptr, bool* stepped = nullptr);
// The book's d2l.sgd: param -= lr * grad / batch_size, then the gradient is zeroed.
void sgd(const std::vector<Tensor>& params, float lr, int64_t batch_size);

// Test accuracy with the parameters on one device (the book), or with every device evaluating a
// shard of each test batch and the counts summed (exercise 4).
double evaluate_accuracy(const DataIter& test_iter, const std::vector<std::vector<Tensor>>& device_params,
                         const std::vector<Device>& devices, bool all_devices, Activation activation = relu);

struct Config {
  std::vector<Device> devices{cpu(0)};
  int64_t batch_size = 256;
  float lr = 0.2f;
  int num_epochs = 10;
  uint64_t seed = 0;
  std::string data_dir;                     // "" = D2L_DATA_DIR, then Debian's dataset-fashion-mnist
  bool scale_batch = false;                 // exercise 1: batch k*b on k devices
  bool scale_lr = false;                    // exercise 2: learning rate times k
  std::string allreduce = "naive";          // exercise 3: naive | ring
  bool eval_all_devices = false;            // exercise 4
  std::string activation = "relu";          // exercise 5: relu | sigmoid
  DType autocast = DType::f32;              // --precision bf16 / fp16: mixed precision (fp16 with loss scaling)
  // --dist: data parallelism over the processes of mpirun too (core/dist). Each process trains on
  // its devices' shards of every minibatch; gradients are summed over its devices, then across the
  // processes with `dist_allreduce` (library: MPI_Allreduce, or ring); rank 0 prints and plots.
  bool dist = false;
  std::string dist_allreduce = "library";
  // --dist: what every rank must agree on besides what train() computes (main.cpp: every flag but
  // the paths of this rank's own files, harness::flag_fingerprint).
  std::vector<std::pair<std::string, std::string>> flags;
  // --bucket-mb: with --dist, gradients go in DDP's buckets of this many MB (chapter 4), launched
  // during backward; 0 = one bucket per parameter; < 0 = no buckets (one allreduce per parameter
  // after backward, the section's loop).
  double bucket_mb = 25;
  std::string plot = "multi_gpu_scratch.png";  // "" = no plot
  bool verbose = true;
  std::optional<ArrayDataset> train_data, test_data;  // generated data instead of Fashion-MNIST
};

struct Result {
  std::vector<double> test_acc;     // per epoch
  std::vector<double> train_loss;   // mean per epoch
  std::vector<int64_t> skipped_steps;  // --precision fp16: per epoch, the steps the loss scaler skipped
  std::vector<float> loss_scale;       //   and its scale at the epoch's end
  double sec_per_epoch = 0;
  int64_t batch_size = 0;           // after scaling
  float lr = 0;                     // after scaling
  std::vector<std::vector<std::vector<float>>> params;  // final parameters, per device
  std::vector<uint64_t> kernels_per_device;
};

// --quick: a generated 10-class image set (4000 train, 1000 test, 28x28) that a CPU trains through
// in seconds; batch 32 and lr 0.3 so the tiny N(0, 0.01) initialisation leaves its plateau in the
// second epoch (a larger lr oscillates there); 4 epochs. Flags given explicitly still win in main().
// Written once here: make_quick and the --help text read kQuick.
struct QuickRecipe {
  int64_t train_images, test_images, side, batch_size;
  float lr;
  int num_epochs;
};
inline constexpr QuickRecipe kQuick{4000, 1000, 28, 32, 0.3f, 4};
void make_quick(Config& cfg);

// The book's train(num_gpus, batch_size, lr), with the exercises as options.
Result train(const Config& cfg);

// The `demo` subcommand: b1 after get_params, allreduce before/after, split of the 4x5 matrix.
void demo(const std::vector<Device>& devices);

}  // namespace d2l::scratch
