// allreduce_bench: naive (the book's) vs ring allreduce over the LeNet gradient set on 2, 3 and 4
// CPU devices. Validates first (device i holds i+1; everyone must hold the exact sum), then times
// (2 warm-up rounds, 20 timed; min and median). algbw = bytes of the set / time; busbw = algbw *
// 2(n-1)/n (what each device's link carries, comparable across n).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/comm.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;

int main() {
  // LeNet's parameters: W1 (20,1,3,3), b1, W2 (50,20,5,5), b2, W3 (800,128), b3, W4 (128,10), b4.
  const std::vector<int64_t> sizes = {180, 20, 25000, 50, 102400, 128, 1280, 10};
  int64_t total = 0;
  for (auto s : sizes) total += s;
  const double bytes = 4.0 * total;
  std::printf("LeNet gradient set: %zu tensors, %.0f KB\n", sizes.size(), bytes / 1024);
  for (int n : {2, 3, 4}) {
    std::vector<Device> devs;
    for (int i = 0; i < n; ++i) devs.push_back(cpu(i));
    use_devices(devs);
    for (const char* algo : {"naive", "ring"}) {
      std::vector<std::vector<Tensor>> grads(sizes.size());  // grads[t][i]: tensor t on device i
      for (size_t t = 0; t < sizes.size(); ++t)
        for (int i = 0; i < n; ++i) grads[t].push_back(Tensor::full({sizes[t]}, float(i + 1), devs[i]));
      for (auto& g : grads) allreduce(g, algo);
      const float want = n * (n + 1) / 2.0f;
      for (auto& g : grads)
        for (auto& x : g)
          for (float v : x.to_vector())
            if (v != want) {
              std::printf("VALIDATION FAILED: %s on %d devices gave %g, expected %g\n", algo, n, v, want);
              return 1;
            }
      std::vector<double> times;
      for (int rep = 0; rep < 22; ++rep) {
        auto t0 = std::chrono::steady_clock::now();
        for (auto& g : grads) allreduce(g, algo);
        waitall();
        if (rep >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(times.begin(), times.end());
      double tmin = times.front(), tmed = times[times.size() / 2];
      double algbw = bytes / tmed / 1e9, busbw = algbw * 2.0 * (n - 1) / n;
      std::printf("%d devices  %-5s  min %7.3f ms  median %7.3f ms  algbw %6.2f GB/s  busbw %6.2f GB/s\n", n, algo,
                  tmin * 1e3, tmed * 1e3, algbw, busbw);
    }
  }
  return 0;
}
