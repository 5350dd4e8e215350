// conv2d kernel4's inner loops for one vector width (conv2d_blocked.cpp says what they compute).
// No include guard: conv2d_blocked.cpp includes this file once per ISA, inside a namespace that sets
//   VW  floats per vector register     NV  vectors per block (V = VW * NV output channels)
//   R   output positions per tile (R * NV accumulators)
// and inside that ISA's `#pragma GCC target` region, so that GCC's vector types below compile to its
// registers and instructions (AVX-512's zmm, AVX2's ymm with FMA, or plain SSE).

using Vec = float __attribute__((vector_size(VW * sizeof(float))));
constexpr int V = VW * NV;

// One tile: RT output positions starting at p0 (oh*OW + ow order; positions past the plane repeat its
// last one, computed but not stored), the V output channels of block wb. out[r][v].
template <int RT>
[[gnu::always_inline]] inline void tile(const Job& j, const float* xp, const float* wb, int64_t p0, float* out) {
  const Conv2dShape& s = j.pl.s;
  const int64_t OW = s.OW();
  const float* base[RT];  // where position r's window starts in xp
  int64_t oh = p0 / OW, ow = p0 % OW;
#pragma GCC unroll 16
  for (int r = 0; r < RT; ++r) {
    base[r] = xp + oh * s.stride_h * j.pl.Wp + ow * s.stride_w;
    if (p0 + r + 1 < j.pl.P && ++ow == OW) ow = 0, ++oh;  // the next position (the last one repeats)
  }
  Vec acc[RT][NV] = {};
  for (int64_t k = 0; k < j.window; ++k) {  // the window's taps (ci, kh, kw), flattened
    const int64_t o = j.tap[k];             // ci*Hp*Wp + kh*Wp + kw
    Vec wv[NV];
    std::memcpy(wv, wb + k * V, sizeof wv);
#pragma GCC unroll 16
    for (int r = 0; r < RT; ++r) {
      const float xv = base[r][o];  // one x value, broadcast to V channels
#pragma GCC unroll 4
      for (int jv = 0; jv < NV; ++jv) acc[r][jv] += xv * wv[jv];
    }
  }
  std::memcpy(out, acc, sizeof acc);
}

// Items [begin, end) of job j: a thread pads an image once for the consecutive blocks it takes of it.
void items(const Job& j, int64_t begin, int64_t end) {
  const Conv2dShape& s = j.pl.s;
  const int64_t OB = (s.OC + V - 1) / V, KK = s.KH * s.KW, P = j.pl.P;
  const bool padded = s.pad_h > 0 || s.pad_w > 0;
  const int64_t xp_size = s.C * j.pl.Hp * j.pl.Wp;
  Scratch<float> xp_buf(j.workspace, padded ? xp_size : 0);
  float* xp = xp_buf.data();
  int64_t padded_n = -1;
  alignas(64) float out[R * V];
  for (int64_t item = begin; item < end; ++item) {
    const int64_t n = item / OB, ob = item % OB;
    const float* x_n = j.x + n * s.C * s.H * s.W;
    if (padded && padded_n != n) {
      pad_image(s, j.pl, x_n, xp);
      padded_n = n;
    }
    const float* src = padded ? xp : x_n;
    const float* wob = j.wb + ob * s.C * KK * V;
    float* y_n = j.y + n * s.OC * P;
    int64_t p0 = 0;
    for (; p0 + R <= P; p0 += R) {
      tile<R>(j, src, wob, p0, out);
      store_tile(s, P, V, out, R, y_n, ob * V, p0);
    }
    for (; p0 < P; p0 += kTail) {
      tile<kTail>(j, src, wob, p0, out);
      store_tile(s, P, V, out, std::min<int64_t>(kTail, P - p0), y_n, ob * V, p0);
    }
  }
}
