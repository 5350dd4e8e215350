// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
// The inner loops go eight elements at a time with a fixed-length loop: that is what GCC vectorizes
// at -O2 (it leaves loops of unknown length scalar).
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void bias_add_forward(const Ctx& c, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner) {
  // One "row" = one (o, c) pair: inner contiguous floats sharing the bias b[c].
  c.parallel_for(outer * C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float bias = b[r % C];
      const float* xr = x + r * inner;
      float* yr = y + r * inner;
      int64_t i = 0;
      for (; i + 8 <= inner; i += 8) {
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = xr[i + j] + bias;
        for (int j = 0; j < 8; ++j) yr[i + j] = v[j];
      }
      for (; i < inner; ++i) yr[i] = xr[i] + bias;
    }
  });
}

void bias_add_backward(const Ctx& c, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  // Split over channels: each db[c] is summed by one thread in a fixed order, in double, so the
  // result does not depend on the thread count. Four running sums (element i of a row goes to sum
  // i % 4, the tail to sum 0) instead of one: the additions no longer wait for each other.
  c.parallel_for(C, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const float* row = dy + (o * C + ch) * inner;
        int64_t i = 0;
        for (; i + 4 <= inner; i += 4) {
          s0 += row[i];
          s1 += row[i + 1];
          s2 += row[i + 2];
          s3 += row[i + 3];
        }
        for (; i < inner; ++i) s0 += row[i];
      }
      db[ch] = static_cast<float>((s0 + s1) + (s2 + s3));
    }
  });
}

}  // namespace d2l::kernels::cpu
