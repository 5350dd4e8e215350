// argmax: x (N, K) -> idx (N) int32, the first index of each row's maximum.
// count_correct: correct[0] = (float) #{i : argmax(x[i]) == labels[i]}.
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

static int32_t row_argmax(const float* row, int64_t K) {
  int64_t best = 0;
  for (int64_t k = 1; k < K; ++k)
    if (row[k] > row[best]) best = k;  // strict '>' keeps the first maximum
  return static_cast<int32_t>(best);
}

void argmax(const Ctx& c, const float* x, int32_t* idx, int64_t N, int64_t K) {
  c.parallel_for(N, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) idx[i] = row_argmax(x + i * K, K);
  });
}

void count_correct(const Ctx& c, const float* x, const int32_t* labels, float* correct, int64_t N, int64_t K) {
  // Fixed-size chunks of rows, one count per chunk, added in chunk order (thread-count independent).
  constexpr int64_t kChunk = 1024;
  const int64_t chunks = (N + kChunk - 1) / kChunk;
  std::vector<int64_t> partial(static_cast<size_t>(chunks), 0);
  c.parallel_for(chunks, [&](int64_t lo, int64_t hi) {
    for (int64_t k = lo; k < hi; ++k) {
      const int64_t end = k * kChunk + kChunk < N ? k * kChunk + kChunk : N;
      int64_t n_ok = 0;
      for (int64_t i = k * kChunk; i < end; ++i) n_ok += row_argmax(x + i * K, K) == labels[i];
      partial[static_cast<size_t>(k)] = n_ok;
    }
  });
  int64_t total = 0;
  for (int64_t p : partial) total += p;
  correct[0] = static_cast<float>(total);
}

}  // namespace d2l::kernels::cpu
