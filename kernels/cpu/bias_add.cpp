// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
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
      for (int64_t i = 0; i < inner; ++i) yr[i] = xr[i] + bias;
    }
  });
}

void bias_add_backward(const Ctx& c, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  // Split over channels: each db[c] is summed by one thread in a fixed order (o, then i), in double,
  // so the result does not depend on the thread count.
  c.parallel_for(C, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double s = 0.0;
      for (int64_t o = 0; o < outer; ++o) {
        const float* row = dy + (o * C + ch) * inner;
        for (int64_t i = 0; i < inner; ++i) s += row[i];
      }
      db[ch] = static_cast<float>(s);
    }
  });
}

}  // namespace d2l::kernels::cpu
