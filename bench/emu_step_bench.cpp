// emu_step_bench: what running the CUDA kernels without a GPU costs. Milliseconds per training step
// of the runtime's smoke MLP (chapters/mlp_smoke: 20 -> 64 -> 10, batch 128 split over the devices,
// softmax cross-entropy, allreduce, SGD) on emulated GPUs (emu(i): the kernels of kernels/cuda run by
// the emulation in kernels/emu) against the same step on CPU devices (cpu(i): kernels/cpu), on one
// device and on two. Emulated GPUs run their GEMMs either as --gemm cublas (the default: the CPU GEMM
// stands in for cuBLAS) or as --gemm tiled (the emulated tiled kernel of kernels/cuda/matmul.cu).
// 1. Validates: every configuration's training loss equals the one-CPU-device run's (relative 1e-4).
// 2. Times smoke::run for one epoch of --steps steps: 1 warm-up run (also the validation), then
//    --repeats runs; a step's time is the epoch's time / steps (min and median over the runs).
//    Data generation, initialisation and the test pass are outside the epoch's time.
// Napkin math: the slowdown emu/cpu (median over median), and the kernels each device runs a step.
//   emu_step_bench [--steps S] [--repeats R]      defaults: 20 steps, 5 repeats
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "chapters/mlp_smoke/mlp_smoke.hpp"
#include "core/ops/op.hpp"  // detail::set_gemm: the GEMM of emulated GPUs (the --gemm flag)
#include "core/runtime.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/kernels.hpp"  // the emulated GEMMs, timed alone; set_plain_blocks

namespace b = d2l::bench;
using d2l::Device;

namespace {

struct Run {
  double step_min = 0, step_median = 0;  // seconds per step
  double loss = 0;                        // mean training loss of the epoch
  double kernels_per_step = 0;            // kernels each device ran per step (the mean over devices)
};

Run time_steps(const std::vector<Device>& devices, const std::string& gemm, int steps, int repeats) {
  d2l::detail::set_gemm(gemm);
  d2l::use_devices(devices);  // the cores split between the devices, as the chapter programs do
  d2l::smoke::Config cfg;
  cfg.devices = devices;
  cfg.verbose = false;
  cfg.num_epochs = 1;
  cfg.n_train = steps * cfg.batch_size;
  cfg.n_test = cfg.batch_size;  // the test pass is not timed: keep it short
  Run r;
  const d2l::smoke::Result warm = d2l::smoke::run(cfg);
  r.loss = warm.epoch_loss.at(0);
  for (uint64_t k : warm.kernels_per_device) r.kernels_per_step += double(k) / steps / double(devices.size());
  std::vector<double> per_step;
  for (int i = 0; i < repeats; ++i) per_step.push_back(d2l::smoke::run(cfg).sec_per_epoch / steps);
  r.step_min = *std::min_element(per_step.begin(), per_step.end());
  r.step_median = b::median_of(per_step);
  return r;
}

// GFLOP/s of the emulated tiled GEMM, n^3, on `threads` OS threads (best of 3 after a warm-up),
// validated against the CPU GEMM; 0 when wrong.
double tiled_gflops(int64_t n, int threads) {
  namespace kc = d2l::kernels::cpu;
  namespace ke = d2l::kernels::emu;
  const std::vector<float> A = b::random_data(n * n, 1), B = b::random_data(n * n, 2);
  std::vector<float> ref(n * n), C(n * n);
  kc::gemm(kc::serial_ctx(), false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, ref.data());
  kc::ThreadPool pool(threads - 1);
  const kc::Ctx ctx{threads, &pool};
  auto run = [&] {
    ke::gemm(&ctx, ke::GemmKernel::tiled, false, false, n, n, n, 1.0f, A.data(), B.data(), 0.0f, C.data());
  };
  run();
  double err = 0, scale = 0;
  for (int64_t i = 0; i < n * n; ++i) {
    err = std::max(err, double(std::fabs(C[i] - ref[i])));
    scale = std::max(scale, double(std::fabs(ref[i])));
  }
  if (!(err <= 1e-4 * scale)) return 0;
  double best = 1e30;
  for (int r = 0; r < 3; ++r) {
    const double t0 = b::wall_now();
    run();
    best = std::min(best, b::wall_now() - t0);
  }
  return 2.0 * double(n) * double(n) * double(n) / best * 1e-9;
}

int arg(int argc, char** argv, const char* flag, int fallback) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], flag) == 0) return std::atoi(argv[i + 1]);
  return fallback;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = std::max(1, arg(argc, argv, "--steps", 20));
  const int repeats = std::max(1, arg(argc, argv, "--repeats", 5));
  b::banner("emu_step_bench: one training step of the smoke MLP (batch 128) on emulated GPUs vs CPU devices");
  std::printf("  %d cores (D2L_NUM_THREADS overrides), %d steps a run, 1 warm-up + %d runs\n\n", d2l::num_cores(), steps,
              repeats);
  std::printf("%-18s %-7s %9s %9s %11s %10s  %s\n", "devices", "gemm", "min ms", "median ms", "kernels/dev", "emu/cpu",
              "loss");

  struct Config {
    std::vector<Device> devices;
    const char* gemm;
    const char* key;
    bool plain = true;  // false: every block on a fiber per thread (kernels/emu/block.hpp), for comparison
  };
  const std::vector<Config> configs = {
      {{d2l::cpu(0)}, "-", "cpu1"},
      {{d2l::emu(0)}, "cublas", "emu1_cublas"},
      {{d2l::emu(0)}, "tiled", "emu1_tiled"},
      {{d2l::cpu(0), d2l::cpu(1)}, "-", "cpu2"},
      {{d2l::emu(0), d2l::emu(1)}, "cublas", "emu2_cublas"},
      {{d2l::emu(0), d2l::emu(1)}, "tiled", "emu2_tiled"},
      {{d2l::emu(0), d2l::emu(1)}, "cublas", "emu2_cublas_fibers", false},
  };
  double reference_loss = 0, cpu_median = 0;
  bool ok = true;
  for (const Config& c : configs) {
    const bool on_cpu = c.devices[0].kind == d2l::DeviceKind::cpu;
    d2l::cuda_emu::set_plain_blocks(c.plain);
    const Run r = time_steps(c.devices, on_cpu ? "cublas" : c.gemm, steps, repeats);  // gemm: only emu reads it
    d2l::cuda_emu::set_plain_blocks(true);
    if (reference_loss == 0) reference_loss = r.loss;
    if (on_cpu) cpu_median = r.step_median;
    char ratio[16] = "";
    if (!on_cpu) std::snprintf(ratio, sizeof ratio, "%.1fx", r.step_median / cpu_median);
    std::printf("%-18s %-7s %9.2f %9.2f %11.0f %10s  %.6f%s\n", d2l::str(c.devices).c_str(), c.gemm, 1e3 * r.step_min,
                1e3 * r.step_median, r.kernels_per_step, ratio, r.loss, c.plain ? "" : "  (fibers only)");
    b::result(std::string("emu_step_ms_") + c.key, 1e3 * r.step_median);
    if (!(std::fabs(r.loss - reference_loss) <= 1e-4 * reference_loss)) {
      std::printf("  validation FAILED: loss %.6f differs from cpu(0)'s %.6f\n", r.loss, reference_loss);
      ok = false;
    }
  }
  std::printf("\nemu/cpu: median ms per step on the emulated devices over the CPU devices' (same device count).\n");
  std::printf("(fibers only): the same step with every block on a fiber per thread, no plain blocks.\n\n");
  for (int threads : {1, 2}) {
    const double g = tiled_gflops(256, threads);
    std::printf("emulated tiled GEMM 256^3, %d thread%s: %.3f GFLOP/s%s\n", threads, threads > 1 ? "s" : "", g,
                g == 0 ? "  validation FAILED" : "");
    b::result("emu_tiled_gemm_gflops_" + std::to_string(threads), g);
    ok = ok && g > 0;
  }
  std::printf("load average at the end: %.2f (a 2-core machine is busy beyond 2)\n", b::load_average());
  return ok ? 0 : 1;
}
