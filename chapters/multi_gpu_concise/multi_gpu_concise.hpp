// Concise multi-GPU training (d2l "Gluon implementation for multi-GPU computation", now "Concise
// Implementation for Multiple GPUs", and its Chinese edition, 8.5; the Gluon lab on kvstores and
// per-device parameters, "Training on multiple GPUs with gluon"): the
// network is a Block whose parameters live as identical replicas on every device, split_and_load
// cuts each minibatch into one shard per device, every device runs forward and backward on its
// shard, and the Trainer sums the gradients through a kvstore and updates every replica.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "datasets/data_iter.hpp"

namespace d2l::concise {

// ---- the networks (nets.cpp)
// "Initialize Model Parameters on Multiple GPUs": ResNet-18 for 28x28 images. A 3x3 stride-1 stem
// without max pooling, then four resnet_blocks of two Residuals (64, 128, 256, 512 channels; the
// last three halve height and width), global average pooling and Dense(num_classes).
// X (N, C, H, W) -> (N, num_classes). sync_bn: every BatchNorm normalises with the statistics of
// the whole data-parallel batch (SyncBatchNorm) instead of each device's shard; same parameters
// and names, so checkpoints move between the two.
std::shared_ptr<nn::Sequential> resnet18(int64_t num_classes, bool sync_bn = false);
// The lab's CNN: conv 20@3x3 relu, max pool 2/2, conv 50@5x5 relu, max pool 2/2, flatten, dense 128
// relu, dense 10. X (N, 1, 28, 28) -> (N, 10) (any H, W >= 16).
std::shared_ptr<nn::Sequential> lab_cnn();
// --model: "resnet18" or "lab-cnn" (ConfigError naming the choices otherwise).
std::shared_ptr<nn::Sequential> make_net(const std::string& model, bool sync_bn = false);
// The initialisation each source uses: resnet18 init.Normal(sigma=0.01) (d2l), lab-cnn
// Gluon's default, uniform in [-0.07, 0.07] (the Gluon lab).
Init default_init(const std::string& model);

// ---- one minibatch (multi_gpu_concise.cpp)
// gloss.SoftmaxCrossEntropyLoss(): per-example losses (N).
Tensor loss(const Tensor& y_hat, const Tensor& y);
// The lab's forward_backward: the loss of each device's shard, then backward on each (they run in
// parallel, each on its own device). Returns each shard's summed loss, detached. Backward runs from
// scaler.scale(l): the loss itself, or (--precision fp16) the loss times the scaler's scale.
std::vector<Tensor> forward_backward(nn::Block& net, const std::vector<Tensor>& Xs, const std::vector<Tensor>& ys,
                                     const optim::GradScaler& scaler = optim::GradScaler({.enabled = false}));
// split_and_load of a host batch: even shards (Gluon's even_split=False: sizes differ by at most
// one), or in proportion to `weights` when given (exercise 2).
nn::BatchShards split_and_load(const Batch& batch, const std::vector<Device>& devices, const std::vector<double>& weights);
// The lab's train_batch: split_and_load the batch (even shards, or in proportion to `weights` when
// given), forward_backward, trainer.step(batch size). Returns forward_backward's losses.
std::vector<Tensor> train_batch(const Batch& batch, nn::Block& net, optim::Trainer& trainer,
                                const std::vector<Device>& devices, const std::vector<double>& weights = {});
// Test accuracy in evaluation mode (BatchNorm uses the running statistics of the evaluating device):
// on devices[0] as the book does (gb.evaluate_accuracy(test_iter, net, ctx[0])), or with every
// device of `devices` evaluating a shard of each batch.
double evaluate_accuracy(const DataIter& data_iter, nn::Block& net, const std::vector<Device>& devices);

// ---- the chapter's defaults, in one place: each source's recipe per device. The program scales
// batch (and ResNet-18's lr) by the device count: the book's train(1, 256, 0.1), train(2, 512, 0.2);
// the lab's run(1, 64, .3), run(2, 128, .3).
struct Recipe {
  int64_t batch_per_device;
  float lr_per_device;
  bool lr_scales;  // lr x devices (the book's ResNet-18), or the same lr on any count (the lab's CNN)
  int num_epochs;
};
inline constexpr Recipe kBookResNet18{256, 0.1f, true, 4};  // d2l's section
inline constexpr Recipe kLabCnn{64, 0.3f, false, 5};        // the Gluon lab
// No GPU and no size flags: ResNet-18 on the first kCpuTrainImages / kCpuTestImages images (a CPU
// took 37 min for one of the book's epochs on one device here), batch 64 per device to take enough
// steps an epoch to leave the initial plateau.
inline constexpr Recipe kCpuSizedResNet18{64, 0.05f, true, 4};
inline constexpr int64_t kCpuTrainImages = 2560, kCpuTestImages = 1000;
// --quick (make_quick): generated images, 3 epochs.
inline constexpr Recipe kQuickResNet18{64, 0.1f, false, 3}, kQuickLabCnn{64, 0.3f, false, 3};
const Recipe& recipe(const std::string& model);  // kBookResNet18 or kLabCnn

// ---- train(num_gpus, batch_size, lr) (train.cpp; what it needs around the loop: run.cpp)
struct Config {
  std::vector<Device> devices{cpu(0)};
  std::string model = "resnet18";    // resnet18 | lab-cnn
  int64_t batch_size = kBookResNet18.batch_per_device;  // the whole minibatch, split over the devices
  float lr = kBookResNet18.lr_per_device;
  int num_epochs = kBookResNet18.num_epochs;
  uint64_t seed = 0;                 // initial parameters and the shuffling
  std::string data_dir;              // "" = D2L_DATA_DIR, then Debian's dataset-fashion-mnist
  int64_t train_subset = 0;          // train on the first N training images (0: all)
  int64_t test_subset = 0;           // evaluate on the first N test images (0: all)
  std::optional<ArrayDataset> train_data, test_data;  // generated data instead of Fashion-MNIST
  std::string kvstore = "device";    // device | local | ring | dist_sync | dist_sync_ring (processes)
  // dist_sync: DDP's gradient buckets of this many MB (core/dist/buckets.hpp), allreduced during
  // backward; 0 = one bucket per parameter; < 0 = none (each key reduced in trainer.step)
  double bucket_mb = 25;
  DType comm_type = DType::f32;      // dist_sync's buckets travel in it: DDP's comm hooks (--comm-hook bf16_compress)
  bool sync_bn = false;
  // Devices of different power (exercise 2): shard sizes in proportion to these (one per device),
  // or measured by probe_weights before training (balance). Neither: even shards.
  std::vector<double> split_weights;
  bool balance = false;
  std::vector<int> threads;          // kernel threads per CPU-backed device (one value: all); empty: as set
  bool eval_all_devices = false;
  int in_flight = 2;                 // minibatches the host enqueues ahead of the one it checks
  DType autocast = DType::f32;       // --precision bf16 / fp16: forward and backward under Autocast(bf16 / f16),
                                     // fp16 with dynamic loss scaling (optim::GradScaler)
  std::string save_params;           // safetensors of the trained net ("" = none)
  std::string checkpoint;            // written after every epoch ("" = none)
  std::string resume;                // checkpoint to continue from ("" = none)
  // dist_sync: what every rank must agree on besides what Run computes (main.cpp: every flag but the
  // paths of this rank's own files, harness::flag_fingerprint).
  std::vector<std::pair<std::string, std::string>> flags;
  bool verbose = true;
};

struct Result {
  std::vector<Device> devices;
  std::string model;
  int64_t batch_size = 0;
  float lr = 0;
  std::vector<double> split_weights;  // what split the batches (empty: even)
  int first_epoch = 1;                // 1, or the epoch a resumed run started with
  std::vector<double> test_acc, train_loss, train_seconds;  // per epoch trained
  // --precision fp16: per epoch trained, the steps the GradScaler skipped and its scale at the end
  std::vector<int64_t> skipped_steps;
  std::vector<float> loss_scale;
  std::shared_ptr<nn::Sequential> net;  // the trained net, replicas on every device
};

// Whether cfg.kvstore trains the processes of mpirun together (dist_sync, dist_sync_ring).
bool distributed(const Config& cfg);
// Checks what can be checked without data (devices, sizes, names, lists); ConfigError naming the
// flag otherwise. train() calls it first.
void validate(const Config& cfg);
// The book's train(num_gpus, batch_size, lr): "running on: [...]", then a line per epoch
// "epoch 1, training time: 63.5 sec, test_acc 0.86" (and a progress line on a terminal).
Result train(const Config& cfg);
// The trained net's parameters, in collect_params() order, from its first device's replicas (to
// compare two runs).
std::vector<std::vector<float>> trained_values(const Result& r);
// --load-params: the net of cfg.model with the parameters of `path` (saved by save_params or by
// PyTorch), evaluated on cfg's test data ("evaluating p.safetensors (--model resnet18) on 10000
// test images on [cpu(0)]" first). Returns the accuracy and how many images it counts.
struct SavedResult {
  double accuracy = 0;
  int64_t images = 0;
};
SavedResult evaluate_saved(const Config& cfg, const std::string& path);
// One PNG with a test-accuracy curve per run; "" on success, or why not.
std::string plot_runs(const std::vector<Result>& runs, const std::string& path);

// The training (train = true) or test set: Fashion-MNIST, or cfg's generated set when it has one,
// cut to its subset. ConfigError when the subset is larger than the set.
ArrayDataset load_data(const Config& cfg, bool train);
// --quick: a generated 10-class image set a CPU trains through in seconds, sized for cfg.model
// (lab-cnn: 4000 + 1000 images of 28x28; resnet18: 800 + 200 of 12x12), batch 64 per device, 3 epochs.
void make_quick(Config& cfg);

// ---- the section's cells (demo.cpp)
// d2l's section: resnet18 initialised on two devices, split_and_load of a (4, 1, 28, 28) batch and the
// net's output on each, weight.data() on the host, then the same values on both devices.
void demo(const std::vector<Device>& devices);
// the Gluon lab: the lab's CNN on two devices, its output on the first four training images, channel 0
// of the first conv's weight on each device (equal), then its gradient on each (different).
void lab(const std::vector<Device>& devices, const Config& data);

}  // namespace d2l::concise
