// gemm16_bench: the CPU's 16-bit GEMMs against its float32 GEMM (kernel3, the members gemm picks), in
// one run: bfloat16 on VDPBF16PS (gemm16_dpbf16, where the CPU has AVX512-BF16), bfloat16 and float16
// widened into float32 (gemm16_widened, the portable member), on the chapters' GEMMs (ResNet-18's
// im2col products at batch 256, the dense layers) and squares 512..2048. The mixed-precision target
// reads from its ratios: a 16-bit GEMM's time over float32's.
// 1. Validates each 16-bit member against gemm16_naive on a small product of each transpose combination.
// 2. Times each (min of repeats over at least --min-seconds).
//   gemm16_bench [--threads T] [--min-seconds S]
// Output: a markdown table, then "RESULT gemm16_<member>_over_f32_t<threads>_<shape> <time ratio>" lines.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace b = d2l::bench;
namespace cpu = d2l::kernels::cpu;
using cpu::Float16;

namespace {

struct Shape {
  std::string name;
  int64_t M, N, K;
  bool ta, tb;
};

std::vector<uint16_t> narrowed(Float16 f, const std::vector<float>& x) {
  std::vector<uint16_t> h;
  for (float v : x) h.push_back(f == Float16::bf16 ? cpu::bf16_from_float(v) : cpu::f16_from_float(v));
  return h;
}

using Gemm16 = std::function<void(const cpu::Ctx&, Float16, const Shape&, const uint16_t*, const uint16_t*, float*)>;
struct Member {
  std::string name, key;
  Float16 f;
  Gemm16 run;
};

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double min_seconds = 0.3;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--threads") threads = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--min-seconds") min_seconds = std::atof(argv[++i]);
    else {
      std::fprintf(stderr, "usage: gemm16_bench [--threads T] [--min-seconds S]\n");
      return 2;
    }
  }
  if (threads < 1 || !(min_seconds > 0)) {
    std::fprintf(stderr, "error: need --threads >= 1 and --min-seconds > 0\n");
    return 2;
  }
  b::banner("gemm16_bench: 16-bit GEMMs against float32's, time ratios");
  cpu::ThreadPool pool(threads - 1);
  const cpu::Ctx c{threads, threads > 1 ? &pool : nullptr};

  std::vector<Member> members;
  if (cpu::has_avx512_bf16())
    members.push_back({"bf16 VDPBF16PS", "dpbf16", Float16::bf16,
                       [](const cpu::Ctx& c, Float16, const Shape& s, const uint16_t* A, const uint16_t* B, float* C) {
                         cpu::gemm16_dpbf16(c, true, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A, B, 0.0f, C);
                       }});
  else
    std::printf("this CPU has no AVX512-BF16: no VDPBF16PS column\n");
  for (Float16 f : {Float16::bf16, Float16::f16})
    members.push_back({f == Float16::bf16 ? "bf16 widened" : "fp16 widened", f == Float16::bf16 ? "bf16_widened" : "f16_widened", f,
                       [](const cpu::Ctx& c, Float16 f, const Shape& s, const uint16_t* A, const uint16_t* B, float* C) {
                         cpu::gemm16_widened(c, f, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A, B, 0.0f, C);
                       }});

  // 1. validation against gemm16_naive: the same 16-bit values, float32 sums in another order
  for (const Member& m : members)
    for (int t = 0; t < 4; ++t) {
      const Shape s{"check", 61, 83, 97, (t & 1) != 0, (t & 2) != 0};
      const auto A = narrowed(m.f, b::random_data(s.M * s.K, 1)), B = narrowed(m.f, b::random_data(s.K * s.N, 2));
      std::vector<float> ref(static_cast<size_t>(s.M * s.N)), got(ref.size());
      cpu::gemm16_naive(c, m.f, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, ref.data());
      m.run(c, m.f, s, A.data(), B.data(), got.data());
      for (size_t i = 0; i < ref.size(); ++i)
        if (!(std::fabs(ref[i] - got[i]) <= 1e-4f * (1.0f + std::fabs(ref[i])))) {
          std::printf("FAILED: %s differs from gemm16_naive at %zu (ta %d, tb %d)\n", m.name.c_str(), i, s.ta, s.tb);
          return 1;
        }
    }
  std::printf("validated: every 16-bit member matches gemm16_naive on 61x83x97, all four transposes\n");

  const std::vector<Shape> shapes = {
      {"r18 s1 dW", 64, 576, 784, false, true},      {"r18 s4 fwd", 512, 112, 4608, false, false},
      {"r18 s4 dX", 4608, 112, 512, true, false},    {"r18 s4 dW", 512, 4608, 112, false, true},
      {"r18 s3 dW", 256, 2304, 196, false, true},    {"r18 1x1 dX", 576, 588, 128, true, false},
      {"r18 dense", 256, 10, 512, false, false},      {"square 512", 512, 512, 512, false, false},
      {"square 1024", 1024, 1024, 1024, false, false}, {"square 2048", 2048, 2048, 2048, false, false},
  };
  auto best_time = [&](const std::function<void()>& run) {
    run();  // warm-up
    double best = 1e30, spent = 0;
    for (int reps = 0; spent < min_seconds || reps < 3; ++reps) {
      const double t0 = b::wall_now();
      run();
      const double dt = b::wall_now() - t0;
      best = std::min(best, dt), spent += dt;
    }
    return best;
  };
  std::printf("\n%d thread(s); GFLOP/s a thread, and (in brackets) the time over float32's\n\n| shape | M x N x K (ta tb) | float32 (%s) |",
              threads, cpu::gemm_description().c_str());
  for (const Member& m : members) std::printf(" %s |", m.name.c_str());
  std::printf("\n|---|---|---|");
  for (size_t i = 0; i < members.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::vector<std::pair<std::string, double>> results;
  for (const Shape& s : shapes) {
    const auto A = b::random_data(s.M * s.K, 3), B = b::random_data(s.K * s.N, 4);
    std::vector<float> C(static_cast<size_t>(s.M * s.N));
    const double gflop = 2.0 * double(s.M) * double(s.N) * double(s.K) * 1e-9;
    const double f32 = best_time([&] { cpu::gemm(c, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, C.data()); });
    std::printf("| %s | %lld x %lld x %lld (%d %d) | %.1f |", s.name.c_str(), (long long)s.M, (long long)s.N,
                (long long)s.K, s.ta, s.tb, gflop / f32 / threads);
    std::string shape_key = s.name;
    for (char& ch : shape_key) if (ch == ' ') ch = '_';
    for (const Member& m : members) {
      const auto A16 = narrowed(m.f, A), B16 = narrowed(m.f, B);
      const double t = best_time([&] { m.run(c, m.f, s, A16.data(), B16.data(), C.data()); });
      std::printf(" %.1f (%.2fx) |", gflop / t / threads, t / f32);
      std::fflush(stdout);
      results.push_back({"gemm16_" + m.key + "_over_f32_t" + std::to_string(threads) + "_" + shape_key, t / f32});
    }
    std::printf("\n");
  }
  std::printf("\n");
  for (const auto& [key, value] : results) b::result(key, value);
  return 0;
}
