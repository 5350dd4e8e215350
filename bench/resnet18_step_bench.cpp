// resnet18_step_bench: seconds per training step of d2l's ResNet-18 small-image variant (the
// "Concise implementation for multiple GPUs" network) on cpu(0), written with the core ops:
//   conv 64@3x3 pad 1 + batch norm + relu, then 4 stages of 2 residual blocks (64, 128, 256, 512
//   channels; stages 2-4 start with stride 2 and a 1x1 conv shortcut), global average pool, dense 10.
// One step = forward on a batch of 256 1x28x28 inputs, softmax cross-entropy (mean), backward, SGD.
// 1. Validates one downsampling residual block (conv, BN in training mode, relu, 1x1 shortcut, add)
//    on a small input against direct loops in double.
// 2. Times: 1 warm-up step, then repeats; min and median wall time, CPU time beside it.
// Napkin math: the convolutions' flops (forward + data and weight gradients) per step, as GFLOP/s.
//   resnet18_step_bench [--batch N] [--repeats R] [--conv NAME] [--gemm NAME]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "bench/reference_loops.hpp"
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/conv_flag.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace b = d2l::bench;
using d2l::Tensor;

namespace {

const d2l::Device kDev = d2l::cpu(0);
double g_conv_flops = 0;  // per image, forward only; counted while building the first forward

struct Conv {  // nn.Conv2d(in, out, k, stride, padding) with bias, as d2l's Residual
  Tensor w, b;
  int64_t stride, pad;
};
struct BatchNorm {
  Tensor gamma, beta, running_mean, running_var;
};

std::vector<Tensor> g_params;  // every trainable tensor, for SGD

Tensor param(Tensor t) {
  t.attach_grad();
  g_params.push_back(t);
  return t;
}
Conv make_conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad) {
  const float std = std::sqrt(2.0f / static_cast<float>(in * k * k));  // He initialisation
  return {param(d2l::normal({out, in, k, k}, 0, std, kDev)), param(Tensor::zeros({out}, kDev)), stride, pad};
}
BatchNorm make_bn(int64_t c) {
  return {param(Tensor::ones({c}, kDev)), param(Tensor::zeros({c}, kDev)), Tensor::zeros({c}, kDev), Tensor::ones({c}, kDev)};
}
Tensor conv(const Conv& c, const Tensor& x, bool count) {
  Tensor y = d2l::conv2d(x, c.w, c.b, {c.stride, c.stride}, {c.pad, c.pad});
  if (count)
    g_conv_flops += 2.0 * double(c.w.dim(0) * c.w.dim(1) * c.w.dim(2) * c.w.dim(3) * y.dim(2) * y.dim(3));
  return y;
}
Tensor bn(const BatchNorm& n, const Tensor& x) { return d2l::batch_norm(x, n.gamma, n.beta, n.running_mean, n.running_var); }

struct Residual {  // d2l's Residual(input_channels, num_channels, use_1x1conv, strides)
  Conv conv1, conv2;
  bool use_1x1conv;
  Conv conv3;
  BatchNorm bn1, bn2;
  Residual(int64_t in, int64_t out, bool use_1x1conv, int64_t strides)
      : conv1(make_conv(in, out, 3, strides, 1)), conv2(make_conv(out, out, 3, 1, 1)), use_1x1conv(use_1x1conv),
        conv3(use_1x1conv ? make_conv(in, out, 1, strides, 0) : Conv{}), bn1(make_bn(out)), bn2(make_bn(out)) {}
  Tensor forward(const Tensor& X, bool count) const {
    Tensor Y = d2l::relu(bn(bn1, conv(conv1, X, count)));
    Y = bn(bn2, conv(conv2, Y, count));
    return d2l::relu(Y + (use_1x1conv ? conv(conv3, X, count) : X));
  }
};

struct ResNet18 {
  Conv stem = make_conv(1, 64, 3, 1, 1);
  BatchNorm stem_bn = make_bn(64);
  std::vector<Residual> blocks;
  Tensor fc_w, fc_b;
  ResNet18() {
    const int64_t channels[] = {64, 64, 128, 256, 512};
    for (int stage = 1; stage <= 4; ++stage)
      for (int i = 0; i < 2; ++i) {
        const bool first = i == 0 && stage > 1;  // resnet_block(in, out, 2, first_block=stage == 1)
        blocks.emplace_back(first ? channels[stage - 1] : channels[stage], channels[stage], first, first ? 2 : 1);
      }
    fc_w = param(d2l::normal({10, 512}, 0, 0.05f, kDev));
    fc_b = param(Tensor::zeros({10}, kDev));
  }
  Tensor forward(const Tensor& X, bool count) const {
    Tensor Y = d2l::relu(bn(stem_bn, conv(stem, X, count)));
    for (const auto& blk : blocks) Y = blk.forward(Y, count);
    Y = d2l::reshape(d2l::global_avg_pool2d(Y), {Y.dim(0), 512});
    return d2l::dense(Y, fc_w, fc_b);
  }
};

void train_step(const ResNet18& net, const Tensor& X, const Tensor& y, float lr, bool count) {
  Tensor l = d2l::softmax_cross_entropy(net.forward(X, count), y);
  l.backward();
  d2l::NoGrad no_grad;
  for (auto& p : g_params) {
    d2l::sgd_update_(p, p.grad(), lr);
    p.zero_grad();
  }
  d2l::waitall();
}

// ---- 1. validation: a downsampling residual block (3 -> 4 channels, stride 2) in direct loops

bool validate() {
  const int N = 2, C = 3, OC = 4, H = 7;
  Residual blk(C, OC, true, 2);
  std::vector<float> xs(N * C * H * H);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = std::sin(0.7 * i);
  const Tensor X = Tensor::from_vector(xs, {N, C, H, H}, kDev);
  const std::vector<float> got = blk.forward(X, false).to_vector();

  const double worst = d2l::bench::bench_ref::residual_block_error(
      xs, N, C, H, OC,
      {blk.conv1.w.to_vector(), blk.conv1.b.to_vector(), blk.conv2.w.to_vector(), blk.conv2.b.to_vector(),
       blk.conv3.w.to_vector(), blk.conv3.b.to_vector()},
      got);
  std::printf("validate: residual block 3->4 channels, stride 2, 1x1 shortcut, on 2x3x7x7 vs direct loops in double: "
              "worst relative error %.1e %s\n", worst, worst < 1e-3 ? "(ok)" : "(FAILED: above 1e-3)");
  return worst < 1e-3;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 256;
  int repeats = 3;
  std::string conv = "auto", gemm = "auto";
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--batch") && i + 1 < argc) batch = std::atoll(argv[++i]);
    else if (!std::strcmp(argv[i], "--repeats") && i + 1 < argc) repeats = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--conv") && i + 1 < argc) conv = argv[++i];
    else if (!std::strcmp(argv[i], "--gemm") && i + 1 < argc) gemm = argv[++i];
    else {
      std::fprintf(stderr, "usage: resnet18_step_bench [--batch N] [--repeats R] [--conv NAME] [--gemm NAME]\n");
      return 2;
    }
  }
  if (batch < 1 || repeats < 1) {
    std::fprintf(stderr, "error: --batch and --repeats must be >= 1\n");
    return 2;
  }
  if (!b::apply_conv(conv) || !b::apply_gemm(gemm)) return 2;
  const int threads = d2l::use_devices({kDev});
  b::banner("resnet18_step_bench: d2l's ResNet-18 (small-image variant) training step, core ops on cpu(0)");
  d2l::manual_seed(0);
  if (!validate()) return 1;
  g_params.clear();

  const ResNet18 net;
  std::vector<float> xs(batch * 28 * 28);
  std::vector<int32_t> ys(batch);
  for (int64_t i = 0; i < batch * 28 * 28; ++i) xs[i] = static_cast<float>((i * 7919) % 256) / 255.0f;
  for (int64_t i = 0; i < batch; ++i) ys[i] = static_cast<int32_t>((i * 31) % 10);
  const Tensor X = Tensor::from_vector(xs, {batch, 1, 28, 28}, kDev), y = Tensor::from_vector(ys, {batch}, kDev);

  train_step(net, X, y, 0.1f, true);  // warm-up; counts the conv flops
  const double step_flops = 3 * g_conv_flops * static_cast<double>(batch);  // forward + both gradients
  const b::Stats st = b::time_it([&] { train_step(net, X, y, 0.1f, false); }, 0, repeats);
  std::printf("batch %lld, %d thread(s) on cpu(0), %d repeat(s) after 1 warm-up step\n", (long long)batch, threads, repeats);
  std::printf("  step: min %.2f s, median %.2f s, CPU %.2f s\n", st.min, st.median, st.cpu_median);
  std::printf("  napkin: the 20 convolutions are %.0f GFLOP per step (%.2f GFLOP per image, x3 for the gradients): %.1f GFLOP/s\n",
              step_flops / 1e9, 3 * g_conv_flops / 1e9, step_flops / st.min / 1e9);
  b::result("resnet18_step_t" + std::to_string(threads), st.min);
  b::result("resnet18_step_cpu_t" + std::to_string(threads), st.cpu_median);
  const auto mem = d2l::runtime(d2l::cpu(0)).allocator->stats();
  std::printf("memory: peak resident %.0f MB (process); cpu(0)'s allocator: peak in use %.0f MB, peak reserved %.0f MB\n",
              b::peak_rss_mb(), mem.peak / 1e6, mem.reserved_peak / 1e6);
  b::result("resnet18_step_peak_rss_mb", b::peak_rss_mb());
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return 0;
}
