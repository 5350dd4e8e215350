// zero_bench: chapter 5's ZeRO stages on chapter 2's ResNet-18 (concise::resnet18: the layer,
// nn::Sequential of Residual blocks), Adam, a batch of `--batch` 1x28x28 images per device on N CPU
// devices x 1 thread each, all in one run:
//   replicated data parallelism (zero_stage 0, the 'device' kvstore), ZeRO-1, ZeRO-2, ZeRO-3 with
//   prefetch and ZeRO-3 without (FullyShardedDataParallel, a residual block a unit).
// 1. Validates: from the same weights, after 2 steps every stage's parameters against stage 0's
//    (largest relative difference; the sharded stages add the devices' gradients in the same order,
//    so 0 is expected).
// 2. Times: 1 warm-up step, then `--repeats` steps; the median wall time of a step, and each stage
//    against stage 0 (the ratio stage 0 / stage s: above 1 is faster). The peak memory per device is
//    the allocator's (core/allocator.hpp) over the timed steps, the largest device's, against
//    stage 0's. The bytes a device keeps between steps (parameters, .grad buffers, state) are
//    Trainer::memory_per_device's.
// Under mpirun with W > 1 processes (`mpirun -np 2 zero_bench`): the same stages over the ranks, one
// CPU device each (kvstore dist_sync; ZeRO-3 over the ranks, core/optim/zero.hpp), each rank
// its own batch of B; the slowest rank's median and the largest rank's peak. Over processes the
// collectives run on each rank's communication thread beside its compute.
//   zero_bench [--batch B] [--devices N] [--repeats R]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/autograd.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/optim/fsdp.hpp"
#include "core/optim/trainer.hpp"
#include "core/optim/zero.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace b = d2l::bench;
using d2l::Tensor;

namespace {

struct Config {
  const char* name;
  int stage;
  bool prefetch;
};

struct Outcome {
  double seconds = 0;           // median wall time of a step
  int64_t peak = 0;             // the largest device's allocator peak over the timed steps
  int64_t kept = 0;             // parameters + .grad buffers + state + summed gradient on device 0 between steps
  std::vector<std::vector<float>> params;  // after the validation steps
};

// The largest value over the ranks (every rank gets it).
double max_over_ranks(double v) {
  double m = v;
  for (auto& x : d2l::dist::gather_strings(std::to_string(v))) m = std::max(m, std::stod(x));
  return m;
}

Outcome run(const Config& c, const std::vector<d2l::Device>& devices, int64_t batch, int steps, int repeats) {
  const bool ranks = d2l::dist::world_size() > 1;
  d2l::manual_seed(0);
  auto net = d2l::concise::make_net("resnet18");
  net->initialize(d2l::concise::default_init("resnet18"), devices, true);
  const int64_t total = batch * static_cast<int64_t>(devices.size());
  auto images = [&](int s) {
    const std::vector<float> x = b::random_data(total * 28 * 28, static_cast<uint32_t>(100 + s));
    std::vector<int32_t> y;
    for (int64_t i = 0; i < total; ++i) y.push_back(static_cast<int32_t>((i * 7 + s) % 10));
    return std::pair{d2l::nn::split_and_load(x, {total, 1, 28, 28}, devices, false),
                     d2l::nn::split_and_load(y, {total}, devices, false)};
  };
  {  // the shapes (deferred initialisation) from one forward pass, before the Trainer shards anything
    d2l::NoGrad no_grad;
    (*net)(images(0).first);
  }
  d2l::optim::Trainer trainer(net->collect_params(), "adam", {.learning_rate = 1e-3f, .zero_stage = c.stage},
                              ranks ? "dist_sync" : "device");
  std::unique_ptr<d2l::optim::FullyShardedDataParallel> fsdp;
  if (c.stage == 3) fsdp = std::make_unique<d2l::optim::FullyShardedDataParallel>(net, trainer, d2l::optim::FsdpOptions{c.prefetch});
  int s = 0;
  auto step = [&] {
    auto [Xs, ys] = images(s++);
    auto outs = fsdp ? (*fsdp)(Xs) : (*net)(Xs);
    std::vector<Tensor> ls;
    for (size_t i = 0; i < outs.size(); ++i) ls.push_back(d2l::softmax_cross_entropy(outs[i], ys[i], d2l::Reduction::sum));
    for (auto& l : ls) l.backward();
    trainer.step(total * d2l::dist::world_size());
    d2l::waitall();
  };
  Outcome o;
  for (int i = 0; i < steps; ++i) step();
  if (fsdp) {
    o.params = trainer.shards()->parameters();  // a collective over the ranks
  } else {
    for (auto& p : net->collect_params().trainable()) o.params.push_back(p->list_data()[0].to_vector());
  }
  if (repeats == 0) return o;
  step();  // warm-up
  for (auto& d : devices) d2l::runtime(d).allocator->reset_peak();
  o.seconds = max_over_ranks(b::time_it(step, 0, repeats).median);
  for (auto& d : devices) o.peak = std::max(o.peak, d2l::runtime(d).allocator->stats().peak);
  o.peak = static_cast<int64_t>(max_over_ranks(static_cast<double>(o.peak)));
  const auto m = trainer.memory_per_device()[0];
  o.kept = m.parameter_bytes + m.gradient_bytes + m.state_bytes + (c.stage >= 2 ? m.summed_gradient_bytes : 0);
  return o;
}

double max_rel_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t k = 0; k < a.size(); ++k) {
    if (a[k].size() != b[k].size()) return INFINITY;
    for (size_t e = 0; e < a[k].size(); ++e)
      worst = std::max(worst, std::fabs(double(a[k][e]) - double(b[k][e])) / std::max(1e-6, std::fabs(double(a[k][e]))));
  }
  return worst;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t batch = 64;
  int n = 2, repeats = 3;
  for (int i = 1; i < argc; ++i) {
    auto next = [&](const char* flag) -> long {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", flag);
        std::exit(2);
      }
      char* end = nullptr;
      const long v = std::strtol(argv[++i], &end, 10);
      if (*end || v < 1) {
        std::fprintf(stderr, "error: bad %s '%s': expected a whole number >= 1\n", flag, argv[i]);
        std::exit(2);
      }
      return v;
    };
    if (!std::strcmp(argv[i], "--batch")) batch = next("--batch");
    else if (!std::strcmp(argv[i], "--devices")) n = static_cast<int>(next("--devices"));
    else if (!std::strcmp(argv[i], "--repeats")) repeats = static_cast<int>(next("--repeats"));
    else {
      std::fprintf(stderr, "usage: zero_bench [--batch B] [--devices N] [--repeats R]\n");
      return 2;
    }
  }
  d2l::dist::init();
  const int W = d2l::dist::world_size();
  const bool root = d2l::dist::rank() == 0;
  if (root) b::banner("zero_bench: ZeRO stages 0-3 on chapter 2's ResNet-18, Adam, CPU devices x 1 thread");
  std::vector<d2l::Device> devices;
  for (int i = 0; i < (W > 1 ? 1 : n); ++i) devices.push_back(d2l::cpu(i));
  d2l::use_devices(devices);
  for (auto d : devices) d2l::runtime(d).set_threads(1);
  if (W > 1) n = W;
  if (root)
    std::printf("  %d %s x 1 thread, batch %lld per device (%lld a step), 1x28x28 images, Adam\n", n,
                W > 1 ? "processes (kvstore dist_sync), one device each," : "devices", (long long)batch,
                (long long)(batch * n));
  const Config configs[] = {{"replicated (stage 0)", 0, true}, {"ZeRO-1", 1, true}, {"ZeRO-2", 2, true},
                            {"ZeRO-3, prefetch", 3, true}, {"ZeRO-3, no prefetch", 3, false}};
  // 1. Validation: 2 steps from the same weights on a batch of 4 a device.
  const auto ref = run(configs[0], devices, 4, 2, 0);
  bool ok = true;
  for (size_t c = 1; c < std::size(configs); ++c) {
    const double d = max_rel_diff(ref.params, run(configs[c], devices, 4, 2, 0).params);
    if (root)
      std::printf("validate: %-20s after 2 steps vs stage 0: largest relative difference %.1e %s\n", configs[c].name, d,
                  d <= 1e-5 ? "(ok)" : "(FAILED: above 1e-5)");
    ok = ok && d <= 1e-5;
  }
  if (!ok) {
    d2l::dist::finalize();
    return 1;
  }
  // 2. Timing and memory, every configuration in this one run.
  std::vector<Outcome> out;
  for (const Config& c : configs) out.push_back(run(c, devices, batch, 0, repeats));
  if (!root) {
    d2l::dist::finalize();
    return 0;
  }
  std::printf("%-22s %10s %12s %12s %12s %12s\n", "stage", "s/step", "stage0/this", "peak MB", "this/stage0", "kept MB");
  for (size_t c = 0; c < std::size(configs); ++c)
    std::printf("%-22s %10.3f %11.2fx %12.1f %11.2fx %12.1f\n", configs[c].name, out[c].seconds,
                out[0].seconds / out[c].seconds, double(out[c].peak) / 1e6, double(out[c].peak) / double(out[0].peak),
                double(out[c].kept) / 1e6);
  std::printf("(peak MB: the largest device's allocator peak over the timed steps, activations included; kept MB: "
              "what device 0 keeps between steps, parameters + .grad buffers + Adam's state + the summed gradient "
              "shard; prefetch on CPU devices queues the next unit's copies earlier, but a copy between two devices "
              "makes both compute streams wait for it; over processes the collectives run on each rank's communication "
              "thread)\n");
  d2l::dist::finalize();
  return 0;
}
