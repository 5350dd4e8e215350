// lab_cnn_epoch_bench: seconds per epoch of the Gluon lab's CNN (chapters/multi_gpu_concise:
// conv 20@3x3 relu, max pool 2, conv 50@5x5 relu, max pool 2, dense 128 relu, dense 10; Gluon's
// uniform initialisation, lr 0.3) on real Fashion-MNIST, as the lab's two runs:
//   1 CPU device x 2 threads and 1 device x 1 thread, batch 64 (938 steps an epoch): run(1, 64, .3)
//   2 CPU devices x 1 thread each, batch 128 (469 steps): run(GPU_COUNT, 64 * GPU_COUNT, .3)
// 1. Validates the net's forward on two images against direct loops in double.
// 2. Times `--steps` training steps of concise::train_batch per repeat (the book's timer: training
//    only) after 5 warm-up steps and extrapolates to the epoch (--steps 0: whole epochs).
// Napkin math: about 13.5 MFLOP per image per step (forward + both gradients), as GFLOP/s.
//   lab_cnn_epoch_bench [--steps N] [--repeats R] [--setup all|1x2|1x1|2x1] [--precision fp32|bf16]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/concise_step.hpp"
#include "bench/conv_flag.hpp"
#include "bench/reference_loops.hpp"
#include "core/autograd.hpp"
#include "datasets/fashion_mnist.hpp"

namespace b = d2l::bench;
using d2l::Tensor;

namespace {

// ---- 1. validation: one image through the lab's CNN in direct loops, double

bool validate(const d2l::ArrayDataset& train) {
  const d2l::Device dev = d2l::cpu(0);
  d2l::manual_seed(0);
  auto net = d2l::concise::lab_cnn();
  net->initialize(d2l::concise::default_init("lab-cnn"), {dev});
  std::vector<float> xs(train.features.begin(), train.features.begin() + 2 * 784);
  std::vector<float> got;
  {
    d2l::NoGrad no_grad;
    got = (*net)(Tensor::from_vector(xs, {2, 1, 28, 28}, dev)).to_vector();
  }
  auto p = [&](const char* name) { return net->collect_params()[name].data(dev).to_vector(); };
  double worst = 0;
  for (int n = 0; n < 2; ++n) {
    int h = 0;
    std::vector<double> x(xs.begin() + n * 784, xs.begin() + (n + 1) * 784);
    x = b::bench_ref::conv_relu_pool(x, 1, 28, p("0.weight"), p("0.bias"), 20, 3, false, &h);  // 13x13
    x = b::bench_ref::conv_relu_pool(x, 20, h, p("2.weight"), p("2.bias"), 50, 5, false, &h);  // 4x4
    x = b::bench_ref::dense(x, p("5.weight"), p("5.bias"), 800, 128, true, b::bench_ref::WeightLayout::out_in);
    x = b::bench_ref::dense(x, p("6.weight"), p("6.bias"), 128, 10, false, b::bench_ref::WeightLayout::out_in);
    for (int j = 0; j < 10; ++j) worst = std::max(worst, std::fabs(x[j] - got[n * 10 + j]) / (1e-3 + std::fabs(x[j])));
  }
  std::printf("validate: the lab's CNN on two training images vs direct loops in double: worst relative error %.1e %s\n",
              worst, worst < 1e-3 ? "(ok)" : "(FAILED: above 1e-3)");
  return worst < 1e-3;
}

}  // namespace

int main(int argc, char** argv) {
  const b::SetupFlags flags =
      b::setup_flags(argc, argv, "lab_cnn_epoch_bench", "--steps", "N (0 = whole epochs)", 0, {200, 2}, false);
  b::banner("lab_cnn_epoch_bench: the Gluon lab's CNN (chapter 2), seconds per epoch on Fashion-MNIST");
  d2l::ArrayDataset train;
  try {
    train = d2l::to_array_dataset(d2l::load_split("", true));
  } catch (const std::exception& e) {
    std::printf("skipped: %s\n", e.what());
    return 77;
  }
  d2l::use_devices({d2l::cpu(0)});
  if (!validate(train)) return 1;

  const int steps = static_cast<int>(flags.count), repeats = flags.repeats;  // steps 0: whole epochs
  const d2l::DType autocast = flags.precision == "bf16" ? d2l::DType::bf16 : d2l::DType::f32;
  const std::string key = flags.precision == "bf16" ? "_bf16" : "";  // float32's keys unchanged
  const double mflop_per_image = 13.5;  // (0.24 + 4.05 + 0.20 + 0.003) MFLOP forward, x3 with the gradients
  const std::vector<b::Setup> setups = {{"1x2", {d2l::cpu(0)}, 2}, {"1x1", {d2l::cpu(0)}, 1}, {"2x1", {d2l::cpu(0), d2l::cpu(1)}, 1}};
  std::printf("lr 0.3, batch 64 per device, kvstore device, %s; %s, %d repeat(s) after 5 warm-up steps\n",
              flags.precision == "bf16" ? "bfloat16 under autocast" : "float32", steps == 0 ? "whole epochs" : (std::to_string(steps) + " steps extrapolated to the epoch").c_str(), repeats);
  std::printf("%-6s %-18s %6s | %9s %9s %9s | %9s %8s\n", "setup", "devices", "batch", "s/epoch", "median", "CPU s", "images/s", "GFLOP/s");
  double t1x1 = 0, t2x1 = 0;
  for (const b::Setup& s : setups) {
    if (!b::runs(s, flags.setup)) continue;
    const int64_t batch = 64 * static_cast<int64_t>(s.devices.size());
    d2l::DataIter iter(train, batch, true, 0);
    const auto order = iter.order(0);
    const int64_t epoch_steps = iter.num_batches();
    const int timed = steps == 0 ? static_cast<int>(epoch_steps) : steps;
    b::Model m = b::make_model("lab-cnn", s, 0.3f);
    int64_t next = 0;
    d2l::Batch current;
    auto batch_at = [&](int) -> const d2l::Batch& {
      current = iter.batch(order, next++ % epoch_steps);
      return current;
    };
    b::run_steps(m, 5, batch_at, autocast);
    const b::Stats st = b::time_it([&] { b::run_steps(m, timed, batch_at, autocast); }, 0, repeats);
    const double scale = static_cast<double>(epoch_steps) / timed;
    const double sec = st.min * scale;
    std::printf("%-6s %-18s %6lld | %9.2f %9.2f %9.2f | %9.0f %8.1f\n", s.key, d2l::str(s.devices).c_str(), (long long)batch,
                sec, st.median * scale, st.cpu_median * scale, static_cast<double>(train.n) / sec,
                mflop_per_image * static_cast<double>(train.n) / sec / 1e3);
    b::result(std::string("lab_cnn_epoch") + key + "_" + s.key, sec);
    b::result(std::string("lab_cnn_epoch_cpu") + key + "_" + s.key, st.cpu_median * scale);
    if (std::string(s.key) == "1x1") t1x1 = sec;
    if (std::string(s.key) == "2x1") t2x1 = sec;
  }
  if (t1x1 > 0 && t2x1 > 0) {
    std::printf("2 devices x 1 thread (batch 128) vs 1 device x 1 thread (batch 64), an epoch each: %.2fx the throughput\n", t1x1 / t2x1);
    b::result("lab_cnn" + key + "_2x1_over_1x1", t1x1 / t2x1);
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
