// resnet18_layer_bench: d2l's ResNet-18 small-image variant as chapter 2 writes it with the layer
// (concise::resnet18: nn::Sequential, Residual, BatchNorm, Trainer), one training step on a batch of
// 256 1x28x28 images (split_and_load, forward, softmax cross-entropy, backward on each device,
// Trainer.step with the 'device' kvstore), on
//   1 CPU device x 2 threads (next to PyTorch with 2 threads: pytorch_reference.py resnet),
//   1 device x 1 thread, and 2 CPU devices x 1 thread each (the same total batch, 128 per device).
// 1. Validates the layer's downsampling Residual (conv, BatchNorm in training mode, relu, 1x1 conv
//    shortcut, add) on 2x3x7x7 against direct loops in double.
// 2. Times: 1 warm-up step, then `--repeats` steps; min and median wall time, CPU time beside it.
// Napkin math: about 2.73 GFLOP per image per step (the 20 convolutions, forward + both gradients;
// resnet18_step_bench counts them), printed as GFLOP/s and images/s; the 2x1 / 1x1 throughput ratio.
//   resnet18_layer_bench [--batch N] [--repeats R] [--setup all|1x2|1x1|2x1] [--precision fp32|bf16]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/reference_loops.hpp"

#include "bench/concise_step.hpp"
#include "bench/conv_flag.hpp"
#include "core/autograd.hpp"

namespace b = d2l::bench;
using d2l::Tensor;

namespace {

// ---- 1. validation: nn::Residual(4, use_1x1conv=true, strides=2) in direct loops, double

bool validate() {
  const int N = 2, C = 3, OC = 4, H = 7;
  const d2l::Device dev = d2l::cpu(0);
  d2l::nn::Residual blk(OC, true, 2);
  blk.initialize(d2l::Init::Normal(0.3f), {dev});
  const std::vector<float> xs = b::random_data(N * C * H * H, 7);
  const Tensor X = Tensor::from_vector(xs, {N, C, H, H}, dev);
  const std::vector<float> got = blk(X).to_vector();
  auto w = [&](const std::shared_ptr<d2l::nn::Conv2D>& c) { return c->weight->data(dev).to_vector(); };
  auto bias = [&](const std::shared_ptr<d2l::nn::Conv2D>& c) { return c->bias->data(dev).to_vector(); };
  const double worst = d2l::bench::bench_ref::residual_block_error(
      xs, N, C, H, OC, {w(blk.conv1), bias(blk.conv1), w(blk.conv2), bias(blk.conv2), w(blk.conv3), bias(blk.conv3)}, got);
  std::printf("validate: the layer's Residual(4, use_1x1conv, strides 2) on 2x3x7x7 vs direct loops in double: "
              "worst relative error %.1e %s\n", worst, worst < 1e-3 ? "(ok)" : "(FAILED: above 1e-3)");
  return worst < 1e-3;
}

}  // namespace

int main(int argc, char** argv) {
  const b::SetupFlags flags = b::setup_flags(argc, argv, "resnet18_layer_bench", "--batch", "N", 2, {256, 3}, false);
  b::banner("resnet18_layer_bench: chapter 2's ResNet-18 (concise::resnet18, the layer) training step");
  d2l::use_devices({d2l::cpu(0)});
  if (!validate()) return 1;

  const int64_t batch = flags.count;
  const int repeats = flags.repeats;
  const d2l::DType autocast = flags.precision == "bf16" ? d2l::DType::bf16 : d2l::DType::f32;
  const std::string key = flags.precision == "bf16" ? "_bf16" : "";  // float32's keys unchanged

  d2l::Batch data;  // the same inputs in every setup and in pytorch_reference.py's shape
  data.n = batch;
  data.shape = {batch, 1, 28, 28};
  data.X = b::random_data(batch * 28 * 28, 1);
  for (auto& v : data.X) v = 0.5f * (v + 1.0f);  // pixels in [0, 1)
  for (int64_t i = 0; i < batch; ++i) data.y.push_back(static_cast<int32_t>((i * 31) % 10));

  const double gflop_per_image = 2.73;
  const std::vector<b::Setup> setups = {{"1x2", {d2l::cpu(0)}, 2}, {"1x1", {d2l::cpu(0)}, 1}, {"2x1", {d2l::cpu(0), d2l::cpu(1)}, 1}};
  std::printf("batch %lld of 1x28x28, lr 0.1, kvstore device, %s; 1 warm-up step, %d timed\n", (long long)batch,
              flags.precision == "bf16" ? "bfloat16 under autocast" : "float32", repeats);
  std::printf("%-6s %-22s | %9s %9s %9s | %9s %8s\n", "setup", "devices", "s/step", "median", "CPU s", "images/s", "GFLOP/s");
  double t1x1 = 0, t2x1 = 0;
  for (const b::Setup& s : setups) {
    if (!b::runs(s, flags.setup)) continue;
    b::Model m = b::make_model("resnet18", s, 0.1f);
    b::run_steps(m, 1, [&](int) -> const d2l::Batch& { return data; }, autocast);  // warm-up (and deferred shapes)
    const b::Stats st =
        b::time_it([&] { b::run_steps(m, 1, [&](int) -> const d2l::Batch& { return data; }, autocast); }, 0, repeats);
    std::printf("%-6s %-22s | %9.2f %9.2f %9.2f | %9.1f %8.1f\n", s.key, d2l::str(s.devices).c_str(), st.min, st.median,
                st.cpu_median, static_cast<double>(batch) / st.min, gflop_per_image * static_cast<double>(batch) / st.min);
    b::result(std::string("resnet18_layer_step") + key + "_" + s.key, st.min);
    b::result(std::string("resnet18_layer_step_cpu") + key + "_" + s.key, st.cpu_median);
    if (std::string(s.key) == "1x1") t1x1 = st.min;
    if (std::string(s.key) == "2x1") t2x1 = st.min;
  }
  if (t1x1 > 0 && t2x1 > 0) {
    std::printf("2 devices x 1 thread vs 1 device x 1 thread, same batch: %.2fx the throughput (target >= 1.8x)\n", t1x1 / t2x1);
    b::result("resnet18_layer" + key + "_2x1_over_1x1", t1x1 / t2x1);
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
