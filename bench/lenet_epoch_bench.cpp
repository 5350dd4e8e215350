// lenet_epoch_bench: seconds per epoch of the book's LeNet (d2l "Multi-GPU training from scratch",
// chapters/multi_gpu_scratch: scratch::train, batch 256, lr 0.2) on real Fashion-MNIST, for
//   1 CPU device with 2 threads, 1 device with 1 thread, 2 CPU devices with 1 thread each.
// 1. Validates scratch::lenet's forward on two real images against direct loops in double.
// 2. Times `--steps` training steps per repeat (scratch::train of one epoch on the first steps + 1
//    minibatches of the training set; the book's timer: the training steps only, not the evaluation)
//    and extrapolates to the 235 steps of an epoch (--steps 235 times whole epochs). 5 untimed
//    warm-up steps first; min and median of the repeats.
// Napkin math: an epoch is about 0.81 TFLOP of convolutions and dense layers (forward + both
// backward passes), printed as GFLOP/s. CPU time (all threads, training steps only) is printed
// beside the wall time: on a loaded machine the wall time grows with the load, the CPU time less.
//   lenet_epoch_bench [--steps N] [--repeats R] [--setup all|1x2|1x1|2x1]
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/conv_flag.hpp"
#include "bench/reference_loops.hpp"
#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"
#include "core/runtime.hpp"
#include "datasets/data_iter.hpp"
#include "datasets/fashion_mnist.hpp"

namespace b = d2l::bench;
using d2l::Tensor;

namespace {

// ---- 1. validation: LeNet's forward (conv 20@3x3, relu, avg pool 2, conv 50@5x5, relu, avg pool 2,
// dense 800->128, relu, dense 128->10) in direct loops, double

bool validate(const d2l::ArrayDataset& data) {
  // Parameters of the book's shapes, but uniform in [-0.2, 0.2) so the logits are far from zero.
  const std::vector<std::vector<int64_t>> shapes = {{20, 1, 3, 3}, {20}, {50, 20, 5, 5}, {50}, {800, 128}, {128}, {128, 10}, {10}};
  std::vector<std::vector<float>> p;
  std::vector<Tensor> params;
  uint32_t state = 12345;
  for (const auto& shape : shapes) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (auto& x : v) state = state * 1664525u + 1013904223u, x = 0.4f * (static_cast<float>(state >> 8) / 16777216.0f - 0.5f);
    params.push_back(Tensor::from_vector(v, shape, d2l::cpu(0)));
    p.push_back(v);
  }
  const int n = 2, pixels = 28 * 28;
  std::vector<float> images(data.features.begin(), data.features.begin() + n * pixels);
  const std::vector<float> logits = d2l::scratch::lenet(Tensor::from_vector(images, {n, 1, 28, 28}, d2l::cpu(0)), params).to_vector();
  double worst = 0;
  for (int i = 0; i < n; ++i) {
    int h = 0;
    std::vector<double> x(images.begin() + i * pixels, images.begin() + (i + 1) * pixels);
    auto h1 = b::bench_ref::conv_relu_pool(x, 1, 28, p[0], p[1], 20, 3, true, &h);
    auto h2 = b::bench_ref::conv_relu_pool(h1, 20, h, p[2], p[3], 50, 5, true, &h);
    auto h3 = b::bench_ref::dense(h2, p[4], p[5], 800, 128, true, b::bench_ref::WeightLayout::in_out);
    auto y = b::bench_ref::dense(h3, p[6], p[7], 128, 10, false, b::bench_ref::WeightLayout::in_out);
    for (int j = 0; j < 10; ++j) {
      const double err = std::fabs(y[j] - logits[i * 10 + j]) / (1e-3 + std::fabs(y[j]));
      if (err > worst) worst = err;
    }
  }
  std::printf("validate: scratch::lenet logits of 2 real images vs direct loops in double: worst relative error %.1e %s\n",
              worst, worst < 1e-4 ? "(ok)" : "(FAILED: above 1e-4)");
  return worst < 1e-4;
}

// ---- 2. timing
struct Setup {
  const char* key;  // --setup
  const char* name;
  std::vector<d2l::Device> devices;
  int threads;  // per device
};

struct Epoch {
  b::Stats s;  // seconds per epoch (extrapolated), wall and CPU
  int threads_used = 0;
};

// The first `batches` minibatches' worth of examples of d (all of d when it has fewer).
d2l::ArrayDataset first_batches(const d2l::ArrayDataset& d, int64_t batches, int64_t batch_size) {
  d2l::ArrayDataset out = d;
  out.n = std::min(d.n, batches * batch_size);
  out.features.resize(static_cast<size_t>(out.n) * 28 * 28);
  out.labels.resize(static_cast<size_t>(out.n));
  return out;
}

Epoch time_setup(const Setup& setup, const d2l::scratch::Config& base, int steps, int repeats, int64_t epoch_steps) {
  d2l::use_devices(setup.devices);  // the thread budget: cores / devices ...
  for (auto d : setup.devices) d2l::runtime(d).set_threads(setup.threads);  // ... then the setup's count
  Epoch e;
  e.threads_used = d2l::runtime(setup.devices[0]).threads();
  d2l::scratch::Config cfg = base;
  cfg.devices = setup.devices;
  const d2l::ArrayDataset& all = *base.train_data;
  cfg.train_data = first_batches(all, 5, cfg.batch_size);  // warm-up: caching allocators, scratch buffers, page faults
  d2l::scratch::train(cfg);
  // CPU time: a train() call also copies the data set and evaluates; that part, measured with one
  // step, is subtracted with that step, so the CPU time is the other steps' (all threads).
  cfg.train_data = first_batches(all, 1, cfg.batch_size);
  double overhead = 1e30;
  for (int r = 0; r < 2; ++r) {
    const double c0 = b::cpu_now();
    d2l::scratch::train(cfg);
    overhead = std::min(overhead, b::cpu_now() - c0);
  }
  const int64_t run = std::min<int64_t>(steps + 1, epoch_steps);  // minibatches per timed run
  cfg.train_data = first_batches(all, run, cfg.batch_size);
  const double scale = static_cast<double>(epoch_steps) / run, cpu_scale = static_cast<double>(epoch_steps) / (run - 1);
  std::vector<double> wall, cpu;
  for (int r = 0; r < repeats; ++r) {
    const double c0 = b::cpu_now();
    const d2l::scratch::Result res = d2l::scratch::train(cfg);
    wall.push_back(res.sec_per_epoch * scale);
    cpu.push_back(std::max(0.0, b::cpu_now() - c0 - overhead) * cpu_scale);
  }
  e.s.min = *std::min_element(wall.begin(), wall.end());
  e.s.median = b::median_of(wall);
  e.s.cpu_min = *std::min_element(cpu.begin(), cpu.end());
  e.s.cpu_median = b::median_of(cpu);
  return e;
}

}  // namespace

int main(int argc, char** argv) {
  const b::SetupFlags flags =
      b::setup_flags(argc, argv, "lenet_epoch_bench", "--steps", "N (235 = whole epochs)", 1, {60, 3}, true);
  b::banner("lenet_epoch_bench: the book's LeNet from scratch, Fashion-MNIST, batch 256, lr 0.2");

  d2l::ArrayDataset train, test;
  try {
    train = d2l::to_array_dataset(d2l::load_split("", true));
    test = d2l::to_array_dataset(d2l::load_split("", false));
  } catch (const std::exception& e) {
    std::printf("skipped: Fashion-MNIST not available (%s)\n", e.what());
    return 77;  // meson's "skipped"
  }
  d2l::use_devices({d2l::cpu(0)});
  if (!validate(train)) return 1;

  // The evaluation after the timed steps is not timed; 512 test images keep it short.
  test.n = 512;
  test.features.resize(test.n * 28 * 28);
  test.labels.resize(test.n);
  d2l::scratch::Config base;
  base.verbose = false;
  base.plot = "";
  base.num_epochs = 1;
  base.train_data = train;
  base.test_data = test;
  const int64_t epoch_steps = (train.n + base.batch_size - 1) / base.batch_size;  // 235
  const int steps = static_cast<int>(flags.count), repeats = flags.repeats;
  const double epoch_gflop = 13.46e-3 * static_cast<double>(train.n);  // 13.46 MFLOP per image, see below
  // Per image: conv1 0.243 MFLOP, conv2 4.05, dense 0.205 + 0.003 forward; backward twice that
  // (data and weight gradients; conv1's data gradient is computed too): 3 x 4.49 = 13.46 MFLOP.
  std::printf("timing %s, %d repeat(s) per setup after 5 warm-up steps\n",
              steps >= epoch_steps ? "whole epochs" : (std::to_string(steps) + " steps, extrapolated to an epoch of " +
                                                       std::to_string(epoch_steps) + " steps").c_str(),
              repeats);

  const std::vector<Setup> setups = {{"1x2", "1 device  x 2 threads", {d2l::cpu(0)}, 2},
                                     {"1x1", "1 device  x 1 thread ", {d2l::cpu(0)}, 1},
                                     {"2x1", "2 devices x 1 thread ", {d2l::cpu(0), d2l::cpu(1)}, 1}};
  std::vector<double> seconds;  // per setup run, -1 when skipped
  std::printf("%-22s %7s | %9s %9s %9s | %9s %7s\n", "setup", "threads", "s/epoch", "median", "CPU s", "images/s", "GFLOP/s");
  for (const Setup& setup : setups) {
    if (flags.setup != "all" && flags.setup != setup.key) {
      seconds.push_back(-1);
      continue;
    }
    const Epoch e = time_setup(setup, base, steps, repeats, epoch_steps);
    seconds.push_back(e.s.min);
    std::printf("%-22s %7d | %9.2f %9.2f %9.2f | %9.0f %7.1f\n", setup.name, e.threads_used, e.s.min, e.s.median,
                e.s.cpu_median, static_cast<double>(train.n) / e.s.min, epoch_gflop / e.s.min);
    b::result(std::string("lenet_epoch_") + setup.key, e.s.min);
    b::result(std::string("lenet_epoch_cpu_") + setup.key, e.s.cpu_median);
    std::fflush(stdout);
  }
  if (seconds[1] > 0 && seconds[2] > 0) {
    const double ratio = seconds[1] / seconds[2];
    std::printf("2 devices x 1 thread vs 1 device x 1 thread: %.2fx the throughput (2.0 = perfect scaling)\n", ratio);
    b::result("lenet_2x1_vs_1x1_throughput", ratio);
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
