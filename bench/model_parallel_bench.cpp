// model_parallel_bench: chapter 3's ResNet-50 training step (chapters/model_parallel: the section's
// train(model) with one batch: random 3xSxS inputs, one-hot labels over 1000 classes, MSELoss, SGD
// lr 0.001) on CPU devices:
//   1xT  resnet50 on cpu(0) with T threads (all cores): compare with bench/pytorch_resnet50.py
//   1x1  resnet50 on cpu(0) with 1 thread
//   mp   ModelParallelResNet50 on cpu(0), cpu(1), 1 thread each: no overlap, expect <= 1.05x 1x1's throughput
//   pp   PipelineParallelResNet50(split) on the same two devices: the target is >= 1.5x 1x1's throughput
//   sweep  pp at each split size of --sweep (one repeat each), and the best one
// 1. Validates first: on a small input the model-parallel and pipelined forward passes equal the
//    single-device model's (per micro-batch) within 1e-4; exit 1 otherwise.
// 2. Times: 1 warm-up step per model, then --repeats steps; min and median wall time, CPU time beside.
// Napkin math: the convolutions' and fc's flops per step (forward + both backward passes) as GFLOP/s.
// Memory: the peak resident memory of the process after the 1xT step (PyTorch's script prints its
// own the same way): about 4.4 GB at batch 120 of 128x128.
//   model_parallel_bench [--batch 120] [--image 128] [--repeats 2] [--split 20]
//                        [--sweep 1,3,5,8,10,12,20,40,60] [--setup all|1xT|1x1|mp|pp|sweep]
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "bench/conv_flag.hpp"
#include "chapters/model_parallel/experiment.hpp"
#include "chapters/model_parallel/pipeline_resnet50.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace b = d2l::bench;
namespace mp = d2l::mp;
using d2l::cpu;
using d2l::Tensor;

namespace {

// Forward flops of one image through ResNet-50 (2 per multiply-add): every conv and the fc.
double forward_flops(int64_t image, int64_t classes) {
  auto out = [](int64_t s, int64_t k, int64_t stride, int64_t pad) { return (s + 2 * pad - k) / stride + 1; };
  double f = 0;
  auto conv = [&](int64_t in, int64_t oc, int64_t k, int64_t s) { f += 2.0 * double(in * oc * k * k * s * s); };
  int64_t s = out(image, 7, 2, 3);
  conv(3, 64, 7, s);
  s = out(s, 3, 2, 1);  // max pool
  int64_t inplanes = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int l = 0; l < 4; ++l) {
    int64_t planes = 64 << l;
    for (int i = 0; i < blocks[l]; ++i) {
      int64_t stride = (i == 0 && l > 0) ? 2 : 1, s2 = out(s, 3, stride, 1);
      conv(inplanes, planes, 1, s);
      conv(planes, planes, 3, s2);
      conv(planes, planes * 4, 1, s2);
      if (i == 0) conv(inplanes, planes * 4, 1, s2);
      inplanes = planes * 4;
      s = s2;
    }
  }
  return f + 2.0 * 2048 * double(classes);
}

double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, n = 0;
  for (size_t i = 0; i < a.size(); ++i) d += (double(a[i]) - b[i]) * (double(a[i]) - b[i]), n += double(a[i]) * a[i];
  return a.size() == b.size() ? std::sqrt(d) / std::max(std::sqrt(n), 1e-30) : INFINITY;
}

// The model-parallel and pipelined forward passes against the single-device model on 2 images of
// 3x33x33 (micro-batches of 1: layer4's maps are 2x2, so BatchNorm has 4 values per channel).
bool validate() {
  d2l::use_devices({cpu(0), cpu(1)});
  Tensor x = d2l::uniform({2, 3, 33, 33}, -1, 1, cpu(0));
  d2l::manual_seed(1);
  auto single = mp::resnet50(10);
  d2l::manual_seed(1);
  mp::ModelParallelResNet50 model(cpu(0), cpu(1), 10);
  d2l::manual_seed(1);
  mp::PipelineParallelResNet50 pipe(1, {cpu(0), cpu(1)}, d2l::pipeline::Schedule::gpipe, {}, 10);
  d2l::NoGrad no_grad;
  std::vector<float> ref_full = (*single)(x).to_vector();
  std::vector<float> ref_split = d2l::concat({(*single)(d2l::slice_rows(x, 0, 1)), (*single)(d2l::slice_rows(x, 1, 2))}).to_vector();
  double e_mp = rel_diff(ref_full, model(x).to_vector());
  double e_pp = rel_diff(ref_split, pipe(x).to_vector());
  bool ok = e_mp <= 1e-4 && e_pp <= 1e-4;
  std::printf("validate: model parallel vs one device %.2g, pipelined (split 1) vs one device per micro-batch %.2g: %s\n",
              e_mp, e_pp, ok ? "ok" : "FAILED");
  return ok;
}

struct Args {
  int64_t batch = 120, image = 128, split = 20;
  int repeats = 2;
  std::vector<int64_t> sweep{1, 3, 5, 8, 10, 12, 20, 40, 60};
  std::string setup = "all";
  std::string conv = "auto";                     // the convolution member (--conv, as the chapter's)
  std::string gemm = "auto";                     // the GEMM member (--gemm, as the chapter's)
  std::vector<std::string> schedules{"gpipe"};  // pp: each of these (gpipe, 1f1b, zb-h1)
  std::string checkpoint = "never";              // pp: recomputation
  bool balance = false;                          // pp: cut by each block's measured time
};

std::vector<int64_t> parse_list(const char* s) {
  std::vector<int64_t> v;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) v.push_back(std::atoll(item.c_str()));
  return v;
}

b::Stats time_step(mp::ResNet& model, const mp::Config& cfg, int repeats) {
  return b::time_it([&] { mp::train(model, cfg.devices[0], cfg); }, 1, repeats);
}

void report(const char* label, const std::string& key, const b::Stats& s, double gflop) {
  std::printf("%-44s min %7.2f s  median %7.2f s  cpu %7.2f s  %6.1f GFLOP/s\n", label, s.min, s.median, s.cpu_min,
              gflop / s.min);
  b::result(key, s.min);
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line as it comes, also into a file
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--batch")) a.batch = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--image")) a.image = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--repeats")) a.repeats = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--split")) a.split = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--sweep")) a.sweep = parse_list(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--setup")) a.setup = argv[i + 1];
    else if (!std::strcmp(argv[i], "--conv")) a.conv = argv[i + 1];
    else if (!std::strcmp(argv[i], "--gemm")) a.gemm = argv[i + 1];
    else if (!std::strcmp(argv[i], "--schedules")) {
      a.schedules.clear();
      std::stringstream ss(argv[i + 1]);
      for (std::string item; std::getline(ss, item, ',');) a.schedules.push_back(item);
    } else if (!std::strcmp(argv[i], "--checkpoint")) a.checkpoint = argv[i + 1];
    else if (!std::strcmp(argv[i], "--balance")) a.balance = std::atoi(argv[i + 1]) != 0;
    else {
      std::fprintf(stderr, "usage: model_parallel_bench [--batch N] [--image S] [--repeats R] [--split S] [--sweep a,b,c] "
                           "[--setup all|1xT|1x1|mp|pp|sweep] [--schedules gpipe,1f1b,zb-h1] [--checkpoint never] [--balance 0|1] [--conv NAME] [--gemm NAME]\n");
      return 2;
    }
  }
  if (a.batch < 1 || a.image < 33 || a.repeats < 1 || a.split < 1 || a.split > a.batch) {
    std::fprintf(stderr, "error: need --batch >= 1, --image >= 33, --repeats >= 1, 1 <= --split <= --batch\n");
    return 2;
  }
  if (!b::apply_conv(a.conv) || !b::apply_gemm(a.gemm)) return 2;
  b::banner("model_parallel_bench: ResNet-50 training step (chapter 3's train(model), one batch)");
  if (!validate()) return 1;
  auto want = [&](const char* s) { return a.setup == "all" || a.setup == s; };
  const int cores = d2l::num_cores();
  const double gflop = 3 * forward_flops(a.image, 1000) * double(a.batch) * 1e-9;
  std::printf("batch %lld of 3x%lldx%lld, 1000 classes: %.0f GFLOP per step (forward + 2 backward passes); %d cores\n",
              (long long)a.batch, (long long)a.image, (long long)a.image, gflop, cores);

  mp::Config cfg;
  cfg.batch_size = a.batch, cfg.image_size = a.image, cfg.num_batches = 1, cfg.verbose = false;
  double t11 = 0, tmp = 0, tpp = 0;
  if (want("1xT") || want("1x1")) {
    d2l::manual_seed(0);
    auto net = mp::resnet50(1000);
    cfg.devices = {cpu(0), cpu(1)};
    if (want("1xT")) {
      d2l::use_devices({cpu(0)});
      std::string label = "resnet50, 1 device x " + std::to_string(cores) + " threads";
      report(label.c_str(), "resnet50_step_1x" + std::to_string(cores), time_step(*net, cfg, a.repeats), gflop);
      const auto st = d2l::runtime(cpu(0)).allocator->stats();
      std::printf("memory: peak resident %.0f MB (process); cpu(0)'s allocator: peak in use %.0f MB, peak reserved %.0f MB\n",
                  b::peak_rss_mb(), st.peak / 1e6, st.reserved_peak / 1e6);
      b::result("resnet50_step_peak_rss_mb", b::peak_rss_mb());
    }
    if (want("1x1")) {
      d2l::use_devices({cpu(0)});
      d2l::runtime(cpu(0)).set_threads(1);
      auto s = time_step(*net, cfg, a.repeats);
      t11 = s.min;
      report("resnet50, 1 device x 1 thread", "resnet50_step_1x1", s, gflop);
    }
  }
  cfg.devices = {cpu(0), cpu(1)};
  d2l::use_devices(cfg.devices);
  for (auto& d : cfg.devices) d2l::runtime(d).set_threads(1);
  if (want("mp")) {
    d2l::manual_seed(0);
    mp::ModelParallelResNet50 model(cpu(0), cpu(1), 1000);
    auto s = time_step(model, cfg, a.repeats);
    tmp = s.min;
    report("ModelParallelResNet50, 2 devices x 1 thread", "resnet50_mp_step_2x1", s, gflop);
  }
  if (want("pp") || want("sweep")) {
    d2l::manual_seed(0);
    mp::PipelineParallelResNet50 model(a.split, cfg.devices, d2l::pipeline::Schedule::gpipe, {}, 1000);
    model.checkpoint = d2l::pipeline::parse_checkpoint(a.checkpoint);
    if (a.balance) {  // the cut from each block's measured time on a micro-batch
      Tensor sample = d2l::normal({a.split, 3, a.image, a.image}, 0.0f, 1.0f, cpu(0));
      model.set_partition(mp::balanced_partition(model, sample, cpu(0), 2));
    }
    std::printf("pipeline: %s, --checkpoint %s\n", model.partition_str().c_str(), a.checkpoint.c_str());
    for (const std::string& name : want("pp") ? a.schedules : std::vector<std::string>{}) {
      model.schedule = d2l::pipeline::parse_schedule(name);
      auto s = time_step(model, cfg, a.repeats);
      if (tpp == 0 || s.min < tpp) tpp = s.min;
      std::string label = "PipelineParallelResNet50(" + std::to_string(a.split) + ") " + name + ", 2 x 1 thread";
      report(label.c_str(), "resnet50_pp_step_2x1_" + name, s, gflop);
      if (t11 > 0) std::printf("  %s: %.2fx the throughput of 1 x 1 thread\n", name.c_str(), t11 / s.min);
    }
    model.schedule = d2l::pipeline::parse_schedule(a.schedules.front());
    if (want("sweep")) {
      int64_t best = 0;
      double best_t = INFINITY;
      for (int64_t split : a.sweep) {
        if (split < 1 || split > a.batch) continue;
        model.split_size = split;
        auto s = b::time_it([&] { mp::train(model, cfg.devices[0], cfg); }, 0, 1);
        std::string label = "  split size " + std::to_string(split);
        report(label.c_str(), "resnet50_pp_split_" + std::to_string(split), s, gflop);
        if (s.min < best_t) best_t = s.min, best = split;
      }
      std::printf("best split size: %lld (%.2f s)\n", (long long)best, best_t);
      b::result("resnet50_pp_best_split", double(best));
    }
  }
  if (t11 > 0 && tmp > 0) std::printf("model parallel, 2 x 1 thread vs 1 x 1 thread: %.2fx the throughput (expected <= 1.05x)\n", t11 / tmp);
  if (t11 > 0 && tpp > 0) std::printf("pipelined (fastest schedule), 2 x 1 thread vs 1 x 1 thread: %.2fx the throughput (target >= 1.75x)\n", t11 / tpp);
  std::printf("load average at the end: %.2f\n", b::load_average());
  return 0;
}
