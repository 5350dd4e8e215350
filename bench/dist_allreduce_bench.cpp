// Allreduce across processes (core/dist), the library's (MPI_Allreduce) against our ring over MPI
// point-to-point, 8 B to 256 MB, reported as nccl-tests does: algbw = bytes / time and
// busbw = algbw * 2(n-1)/n (what each rank's link carries). Validates first (exact sums), then
// times (warm-up, then the median of repeats). Run under mpirun:
//   mpirun -np 2 build/bench/dist_allreduce_bench        (as root: OMPI_ALLOW_RUN_AS_ROOT=1 ...)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/runtime.hpp"

using namespace d2l;

static double median_seconds(const Tensor& t, const char* algo, int repeats) {
  std::vector<double> s;
  for (int i = 0; i < repeats; ++i) {
    dist::barrier();
    auto t0 = std::chrono::steady_clock::now();
    dist::allreduce(t, algo);
    waitall();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  // The slowest rank's median: a collective is done when every rank is.
  double med = s[s.size() / 2];
  auto all = dist::gather_strings(std::to_string(med));
  for (auto& x : all) med = std::max(med, std::stod(x));
  return med;
}

int main() {
  dist::init();
  const int W = dist::world_size();
  use_devices({cpu(0)});
  if (dist::rank() == 0)
    std::printf("allreduce over %d processes (float32 sums in host memory)\n%12s %14s %14s %14s %14s %8s\n", W, "bytes",
                "library algbw", "library busbw", "ring algbw", "ring busbw", "ring/lib");
  const int64_t most = int64_t(256) << 20;
  for (int64_t bytes = 8; bytes <= most; bytes = bytes < most && bytes * 4 > most ? most : bytes * 4) {
    const int64_t n = bytes / 4;
    Tensor t = Tensor::full({n}, 1.0f, cpu(0));
    for (const char* algo : {"library", "ring"}) {  // validate: W ones sum to W
      dist::allreduce(t, algo);
      auto v = t.to_vector();
      const float want = algo[0] == 'l' ? static_cast<float>(W) : static_cast<float>(W * W);
      if (v.front() != want || v.back() != want) {
        std::fprintf(stderr, "error: rank %d: %s allreduce of %lld bytes gave %g, expected %g\n", dist::rank(), algo,
                     (long long)bytes, v.front(), want);
        dist::abort(1);
      }
    }
    const int repeats = bytes <= (1 << 20) ? 50 : bytes <= (16 << 20) ? 10 : 4;
    median_seconds(t, "library", 2), median_seconds(t, "ring", 2);  // warm-up
    const double lib = median_seconds(t, "library", repeats), ring = median_seconds(t, "ring", repeats);
    const double bus = 2.0 * (W - 1) / W;
    if (dist::rank() == 0)
      std::printf("%12lld %11.3f GB/s %9.3f GB/s %9.3f GB/s %9.3f GB/s %7.2fx\n", (long long)bytes, bytes / lib * 1e-9,
                  bytes / lib * 1e-9 * bus, bytes / ring * 1e-9, bytes / ring * 1e-9 * bus, lib / ring);
  }
  dist::finalize();
  return 0;
}
