// sum: out[0] = x[0] + ... + x[n-1], accumulated in double, rounded to float once at the end.
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

void sum(const Ctx& c, const float* x, float* out, int64_t n) {
  // Fixed-size chunks (independent of the thread count): each chunk's partial sum is computed by one
  // thread, then the partials are added in chunk order -> bitwise the same for any number of threads.
  constexpr int64_t kChunk = 4096;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  c.parallel_for(chunks, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t end = k * kChunk + kChunk < n ? k * kChunk + kChunk : n;
      double s = 0.0;
      for (int64_t i = k * kChunk; i < end; ++i) s += x[i];
      partial[static_cast<size_t>(k)] = s;
    }
  });
  double total = 0.0;
  for (double p : partial) total += p;
  out[0] = static_cast<float>(total);
}

}  // namespace d2l::kernels::cpu
