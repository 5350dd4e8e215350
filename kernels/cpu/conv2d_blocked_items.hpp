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

// backward_weight: dw for the V output channels of block ob and RT taps k0.. of the window (tapoff: kh*Wp + kw
// of each), summed over every image and output position: acc[r] += x(n, position, tap r) * dy(n, position),
// one image at a time (a sum of N per-image sums rounds less than one sum of N*P products).
// xp holds input channel ci of every image, zero-padded (N planes of Hp*Wp); dyb the block's dy, (N, P, V).
template <int RT>
[[gnu::always_inline]] inline void weight_tile(const WeightJob& j, const float* xp, const float* dyb,
                                               const int64_t* tapoff, float* out) {
  const Conv2dShape& s = j.pl.s;
  const int64_t OH = s.OH(), OW = s.OW(), plane = j.pl.Hp * j.pl.Wp;
  Vec total[RT][NV] = {};
  for (int64_t n = 0; n < s.N; ++n) {  // per image a sum over its positions, then added to the total
    Vec acc[RT][NV] = {};
    const float* xn = xp + n * plane;
    const float* dyn = dyb + n * j.pl.P * V;
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* xrow = xn + oh * s.stride_h * j.pl.Wp;
      for (int64_t ow = 0; ow < OW; ++ow) {
        Vec g[NV];
        std::memcpy(g, dyn + (oh * OW + ow) * V, sizeof g);
        const float* xo = xrow + ow * s.stride_w;
#pragma GCC unroll 16
        for (int r = 0; r < RT; ++r) {
          const float xv = xo[tapoff[r]];  // one x value, broadcast to V channels
#pragma GCC unroll 4
          for (int jv = 0; jv < NV; ++jv) acc[r][jv] += xv * g[jv];
        }
      }
    }
#pragma GCC unroll 16
    for (int r = 0; r < RT; ++r)
#pragma GCC unroll 4
      for (int jv = 0; jv < NV; ++jv) total[r][jv] += acc[r][jv];
  }
  std::memcpy(out, total, sizeof total);
}

// Items [begin, end): input channels ci of block j.ob; pads channel ci of every image once, then sums
// each chunk of R taps of its KH*KW (the last chunk's taps past KH*KW repeat the last one).
void weight_items(const WeightJob& j, int64_t begin, int64_t end) {
  const Conv2dShape& s = j.pl.s;
  const int64_t KK = s.KH * s.KW, plane = j.pl.Hp * j.pl.Wp;
  Scratch<float> xp_buf(j.workspace, s.N * plane);
  float* xp = xp_buf.data();
  alignas(64) float out[R * V];
  for (int64_t ci = begin; ci < end; ++ci) {
    const int64_t ob = j.ob;
    pad_channel(s, j.pl, j.x, ci, xp);
    const float* dyb = j.dyb;
    for (int64_t k = 0; k < KK; k += R) {  // a 3x3 window: one tile of 12 taps, 9 of them stored
      weight_tile<R>(j, xp, dyb, j.tapoff + k, out);
      store_weight_tile(s, V, out, std::min<int64_t>(R, KK - k), j.dw, ob, ci, k);
    }
  }
}
