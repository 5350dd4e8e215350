// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
// The inner loops go eight elements at a time with a fixed-length loop: that is what GCC vectorizes
// at -O2 (it leaves loops of unknown length scalar). Written once over the element type of x, y and
// dy (float16.hpp's V): float32, and autocast's 16-bit activations on CPU devices (a convolution's
// 16-bit output plus its float32 bias, rounded once); b and db are float32.
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

template <class V>
void forward(const Ctx& c, const typename V::T* x, const float* b, typename V::T* y, int64_t outer, int64_t C,
             int64_t inner) {
  // One "row" = one (o, c) pair: inner contiguous elements sharing the bias b[c].
  c.parallel_for(outer * C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float bias = b[r % C];
      const typename V::T* xr = x + r * inner;
      typename V::T* yr = y + r * inner;
      int64_t i = 0;
      for (; i + 8 <= inner; i += 8) {
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = V::get(xr[i + j]) + bias;
        for (int j = 0; j < 8; ++j) yr[i + j] = V::put(v[j]);
      }
      for (; i < inner; ++i) yr[i] = V::put(V::get(xr[i]) + bias);
    }
  });
}

template <class V>
void backward(const Ctx& c, const typename V::T* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  // Split over channels: each db[c] is summed by one thread in a fixed order, in double, so the
  // result does not depend on the thread count. Four running sums (element i of a row goes to sum
  // i % 4, the tail to sum 0) instead of one: the additions no longer wait for each other.
  c.parallel_for(C, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const typename V::T* row = dy + (o * C + ch) * inner;
        int64_t i = 0;
        for (; i + 4 <= inner; i += 4) {
          s0 += V::get(row[i]);
          s1 += V::get(row[i + 1]);
          s2 += V::get(row[i + 2]);
          s3 += V::get(row[i + 3]);
        }
        for (; i < inner; ++i) s0 += V::get(row[i]);
      }
      db[ch] = static_cast<float>((s0 + s1) + (s2 + s3));
    }
  });
}

}  // namespace

void bias_add_forward(const Ctx& c, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner) {
  forward<AsF32>(c, x, b, y, outer, C, inner);
}

void bias_add_backward(const Ctx& c, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  backward<AsF32>(c, dy, db, outer, C, inner);
}

void bias_add16_forward(const Ctx& c, Float16 f, const uint16_t* x, const float* b, uint16_t* y, int64_t outer, int64_t C,
                        int64_t inner) {
  if (f == Float16::bf16) forward<As16<Float16::bf16>>(c, x, b, y, outer, C, inner);
  else forward<As16<Float16::f16>>(c, x, b, y, outer, C, inner);
}

void bias_add16_backward(const Ctx& c, Float16 f, const uint16_t* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  if (f == Float16::bf16) backward<As16<Float16::bf16>>(c, dy, db, outer, C, inner);
  else backward<As16<Float16::f16>>(c, dy, db, outer, C, inner);
}

}  // namespace d2l::kernels::cpu
