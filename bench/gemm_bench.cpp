// gemm_bench: the CPU GEMM family (kernels/cpu/gemm.cpp), GFLOP/s a thread of each member on the
// chapters' GEMMs (im2col's three passes, Winograd's small products, the dense layers: the shapes a
// ResNet-18 step at batch 256 and a LeNet epoch run most) and on squares 256..4096, beside OpenBLAS
// with the kernel set it picked (OPENBLAS_CORETYPE decides: run this program once per setting, as
// bench/gemm_compare.sh does). kernel3 runs once per ISA this CPU has; each column prints its ISA.
// 1. Validates every member against kernel1 on a small product of each transpose combination.
// 2. Times each (min of repeats over at least --min-seconds); kernel1 and kernel2 only where they
//    finish in reasonable time (kernel1 up to 512^3, kernel2 up to 1024^3 multiply-adds).
//   gemm_bench [--threads T] [--min-seconds S] [--squares 0|1] [--chapters 0|1] [--members openblas|all]
// Output: a markdown table, then "RESULT gemm_<member>_t<threads>_<shape> <GFLOP/s a thread>" lines.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace b = d2l::bench;
namespace cpu = d2l::kernels::cpu;

namespace {

struct Shape {
  std::string name;
  int64_t M, N, K;
  bool ta, tb;
};

// (M, N, K, ta, tb) as the chapters call them (counted in a ResNet-18 step and a LeNet epoch).
std::vector<Shape> chapter_shapes() {
  return {
      {"r18 s1 dW", 64, 576, 784, false, true},        // stage 1 backward_weight, 1 image a chunk
      {"r18 s4 fwd", 512, 112, 4608, false, false},    // stage 4 forward, 7 images a chunk
      {"r18 s4 dX", 4608, 112, 512, true, false},      // stage 4 backward_data
      {"r18 s4 dW", 512, 4608, 112, false, true},      // stage 4 backward_weight
      {"r18 s2 dW", 128, 1152, 392, false, true},
      {"r18 s3 dW", 256, 2304, 196, false, true},
      {"r18 wino s1", 64, 113, 64, false, false},      // Winograd's products: one per tile position
      {"r18 wino s3", 256, 32, 256, false, false},
      {"r18 wino s2", 128, 56, 128, false, false},
      {"r18 1x1 dX", 576, 588, 128, true, false},
      {"r18 dense", 256, 10, 512, false, false},
      {"lenet conv1 fwd", 6, 12544, 25, false, false},   // 16 images a chunk
      {"lenet conv2 fwd", 16, 1600, 150, false, false},
      {"lenet conv2 dW", 16, 150, 1600, false, true},
      {"lenet dense", 256, 120, 400, false, true},
  };
}

struct Member {
  std::string name;
  cpu::GemmKernel kernel;
  cpu::VectorIsa isa;
};

double gflop(const Shape& s) { return 2.0 * double(s.M) * double(s.N) * double(s.K) * 1e-9; }

}  // namespace

int main(int argc, char** argv) {
  int threads = 1;
  double min_seconds = 0.3;
  bool squares = true, chapters = true;
  std::string which = "all";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 < argc && a == "--threads") threads = std::atoi(argv[++i]);
    else if (i + 1 < argc && a == "--min-seconds") min_seconds = std::atof(argv[++i]);
    else if (i + 1 < argc && a == "--squares") squares = std::atoi(argv[++i]) != 0;
    else if (i + 1 < argc && a == "--chapters") chapters = std::atoi(argv[++i]) != 0;
    else if (i + 1 < argc && a == "--members") which = argv[++i];
    else {
      std::fprintf(stderr, "usage: gemm_bench [--threads T] [--min-seconds S] [--squares 0|1] [--chapters 0|1] "
                           "[--members openblas|all]\n");
      return 2;
    }
  }
  if (threads < 1 || !(min_seconds > 0) || (which != "all" && which != "openblas")) {
    std::fprintf(stderr, "error: need --threads >= 1, --min-seconds > 0, --members openblas|all\n");
    return 2;
  }
  b::banner("gemm_bench: the CPU GEMM family, GFLOP/s a thread");
  cpu::check_blas();
  cpu::ThreadPool pool(threads - 1);
  const cpu::Ctx c{threads, threads > 1 ? &pool : nullptr};

  std::vector<Member> members;
  if (which == "all") {
    members.push_back({"kernel1 naive", cpu::GemmKernel::naive, cpu::best_vector_isa()});
    members.push_back({"kernel2 blocked", cpu::GemmKernel::blocked, cpu::best_vector_isa()});
    for (cpu::VectorIsa isa : cpu::vector_isas())
      members.push_back({std::string("kernel3 ") + cpu::vector_isa_name(isa), cpu::GemmKernel::packed, isa});
  }
  members.push_back({std::string("OpenBLAS ") + cpu::blas_core_name(), cpu::GemmKernel::openblas,
                     cpu::best_vector_isa()});

  // 1. validation: every member against kernel1
  for (const Member& m : members)
    for (int t = 0; t < 4; ++t) {
      const Shape s{"check", 61, 83, 97, (t & 1) != 0, (t & 2) != 0};
      auto A = b::random_data(s.M * s.K, 1), B = b::random_data(s.K * s.N, 2);
      std::vector<float> ref(static_cast<size_t>(s.M * s.N)), got(ref.size());
      cpu::gemm_naive(c, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, ref.data());
      cpu::set_gemm_isa(m.isa);
      cpu::set_gemm_kernel(m.kernel);
      cpu::gemm(c, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, got.data());
      for (size_t i = 0; i < ref.size(); ++i)
        if (!(std::fabs(ref[i] - got[i]) <= 1e-4f * (1.0f + std::fabs(ref[i])))) {
          std::printf("FAILED: %s differs from kernel1 at %zu (ta %d, tb %d)\n", m.name.c_str(), i, s.ta, s.tb);
          return 1;
        }
    }
  std::printf("validated: every member matches kernel1 on 61x83x97, all four transposes\n");

  std::vector<Shape> shapes;
  if (chapters) shapes = chapter_shapes();
  if (squares)
    for (int64_t n : {256, 512, 1024, 2048, 4096}) shapes.push_back({"square " + std::to_string(n), n, n, n, false, false});

  std::printf("\n%d thread(s); GFLOP/s a thread (all threads' rate / %d)\n\n| shape | M x N x K (ta tb) |", threads,
              threads);
  for (const Member& m : members) std::printf(" %s |", m.name.c_str());
  std::printf("\n|---|---|");
  for (size_t i = 0; i < members.size(); ++i) std::printf("---|");
  std::printf("\n");
  std::vector<std::string> results;
  std::vector<double> rates;
  for (const Shape& s : shapes) {
    auto A = b::random_data(s.M * s.K, 3), B = b::random_data(s.K * s.N, 4);
    std::vector<float> C(static_cast<size_t>(s.M * s.N));
    std::printf("| %s | %lld x %lld x %lld (%d %d) |", s.name.c_str(), (long long)s.M, (long long)s.N,
                (long long)s.K, s.ta, s.tb);
    for (const Member& m : members) {
      const double mac = double(s.M) * double(s.N) * double(s.K);
      if ((m.kernel == cpu::GemmKernel::naive && mac > 512.0 * 512 * 512) ||
          (m.kernel == cpu::GemmKernel::blocked && mac > 1024.0 * 1024 * 1024)) {
        std::printf(" - |");
        continue;
      }
      cpu::set_gemm_isa(m.isa);
      cpu::set_gemm_kernel(m.kernel);
      const auto run = [&] { cpu::gemm(c, s.ta, s.tb, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, C.data()); };
      run();  // warm-up
      double best = 1e30, spent = 0;
      int reps = 0;
      while (spent < min_seconds || reps < 3) {
        const double t0 = b::wall_now();
        run();
        const double dt = b::wall_now() - t0;
        best = std::min(best, dt);
        spent += dt;
        ++reps;
      }
      const double rate = gflop(s) / best / threads;
      std::printf(" %.1f |", rate);
      std::fflush(stdout);
      std::string key = m.kernel == cpu::GemmKernel::packed ? std::string("kernel3_") + std::to_string(cpu::vector_isa_floats(m.isa))
                        : m.kernel == cpu::GemmKernel::openblas ? "openblas"
                        : m.kernel == cpu::GemmKernel::blocked  ? "kernel2"
                                                                : "kernel1";
      std::string shape_key = s.name;
      for (char& ch : shape_key) if (ch == ' ') ch = '_';
      results.push_back("gemm_" + key + "_t" + std::to_string(threads) + "_" + shape_key);
      rates.push_back(rate);
    }
    std::printf("\n");
  }
  std::printf("\n");
  for (size_t i = 0; i < results.size(); ++i) b::result(results[i], rates[i]);
  cpu::set_gemm_kernel(cpu::GemmKernel::automatic);
  cpu::set_gemm_isa(cpu::best_vector_isa());
  return 0;
}
