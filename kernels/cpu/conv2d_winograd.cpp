// conv2d kernel3: Winograd's minimal filtering for 3x3 stride-1 convolutions (any padding), as Lavin
// and Gray write it ("Fast Algorithms for Convolutional Neural Networks", 2016). The family, its
// reference (kernel1) and the choice between the members are in conv2d.cpp.
//
// In one dimension F(m, 3) computes m outputs of a 3-tap correlation, y[i] = sum_k d[i + k] g[k],
// from alpha = m + 2 inputs with alpha multiplications instead of 3m:
//     y = A^T [ (G g) . (B^T d) ]        (. the elementwise product)
// Nested, F(m x m, 3x3) computes an m x m output tile from an alpha x alpha input tile d:
//     U = G g G^T   (the filter, alpha x alpha)      V = B^T d B   (the input tile, alpha x alpha)
//     Y = A^T M A   (the output tile, m x m)          M = U . V     summed over the input channels:
//     M[t][oc][tile] = sum over ci of U[t][oc][ci] * V[t][ci][tile]   for each of the alpha^2 entries t,
// which is alpha^2 GEMMs (OC, C) @ (C, tiles). Per output, 2*C*alpha^2/m^2 flops of GEMM instead of
// 2*C*9: 4x fewer for F(4x4, 3x3) (36/16 against 9), 2.25x for F(2x2, 3x3) (16/4 against 9).
//
// Where the matrices come from (Toom-Cook): y is the coefficients of the product of the polynomials
// d(x) and g(x), read off by evaluating both at alpha points, multiplying, and interpolating back.
// With the points p_j (and infinity, which reads off the leading coefficient):
//     G    row j = (1, p_j, p_j^2) / N_j,   N_j = prod over the other finite points p_k of (p_j - p_k)
//     A^T  column j = (1, p_j, p_j^2, ...) (powers of p_j); the column of infinity is (0, ..., 0, 1)
//     B^T  the interpolation (the transpose of the inverse Vandermonde, the N_j moved into G)
// and a sign may move between a row of G and the same row of B^T (or column of A^T), which is why
// F(2, 3)'s first row of G is +1 although N_0 = (0 - 1)(0 + 1) = -1.
//   F(2, 3): points 0, 1, -1.      F(4, 3): points 0, 1, -1, 2, -2 (N_j = 4, -6, -6, 24, 24).
// tests/test_conv2d.cpp checks both against a double-precision convolution.
//
// Accuracy: the transforms of F(4, 3) scale by up to 5 (B^T) and 8 (A^T) and cancel again, so its
// float rounding error is ~30x im2col's: worst 4.2e-5 of the outputs' root mean square on the
// networks' shapes (1.3e-6 for im2col; 1.9e-6 for F(2, 3), whose transforms only add and halve).
//
// Work split: the filter transform U (alpha^2, OC, C) is made once per call. The tiles of all the
// images (n, tile row, tile column) are cut into chunks of a size fixed by the shape alone; per chunk,
// V (alpha^2, C, tiles) is made, then the alpha^2 GEMMs into M (alpha^2, OC, tiles), then the output
// transform into y. With at least as many chunks as threads each thread takes whole chunks; otherwise
// the chunks run one after another and the threads share each step (input channels, GEMMs, output
// channels). Every GEMM is a one-thread call on a block fixed by the shape, so the results do not
// depend on the thread count, bitwise.
//
// backward_data of a 3x3 stride-1 convolution is itself one: dx = dy convolved with the kernel turned
// by 180 degrees, input and output channels swapped, padding 2 - pad. backward_weight is im2col's.
#include <algorithm>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

// F(2x2, 3x3): points 0, 1, -1 (and infinity).
struct F2 {
  static constexpr int m = 2, alpha = 4;
  static constexpr float BT[alpha][alpha] = {
      {1, 0, -1, 0},
      {0, 1, 1, 0},
      {0, -1, 1, 0},
      {0, 1, 0, -1},
  };
  static constexpr float G[alpha][3] = {
      {1, 0, 0},
      {0.5f, 0.5f, 0.5f},
      {0.5f, -0.5f, 0.5f},
      {0, 0, 1},
  };
  static constexpr float AT[m][alpha] = {
      {1, 1, 1, 0},
      {0, 1, -1, -1},
  };
};

// F(4x4, 3x3): points 0, 1, -1, 2, -2 (and infinity).
struct F4 {
  static constexpr int m = 4, alpha = 6;
  static constexpr float BT[alpha][alpha] = {
      {4, 0, -5, 0, 1, 0},
      {0, -4, -4, 1, 1, 0},
      {0, 4, -4, -1, 1, 0},
      {0, -2, -1, 2, 1, 0},
      {0, 2, -1, -2, 1, 0},
      {0, 4, 0, -5, 0, 1},
  };
  static constexpr float G[alpha][3] = {
      {1.0f / 4, 0, 0},
      {-1.0f / 6, -1.0f / 6, -1.0f / 6},
      {-1.0f / 6, 1.0f / 6, -1.0f / 6},
      {1.0f / 24, 1.0f / 12, 1.0f / 6},
      {1.0f / 24, -1.0f / 12, 1.0f / 6},
      {0, 0, 1},
  };
  static constexpr float AT[m][alpha] = {
      {1, 1, 1, 1, 1, 0},
      {0, 1, -1, 2, -2, 0},
      {0, 1, 1, 4, 4, 0},
      {0, 1, -1, 8, -8, 1},
  };
};

// out (R, R) = L (R, K) @ X (K, K) @ L^T: the shape of all three transforms (L = B^T, G or A^T).
// The loops unroll and the matrices are constants, so the products by 0 vanish and those by 1 are
// plain additions: what the transforms cost is their nonzero entries, as if written out by hand.
// E is float, or Lanes: kLanes tiles at once, one per lane, each lane computed as the float code.
template <int R, int K, class E>
[[gnu::always_inline]] inline void sandwich(const float (&L)[R][K], const E (&X)[K][K], E (&out)[R][R]) {
  E LX[R][K];
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < K; ++j) {
      E acc{};
      bool any = false;
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k)
        if (L[i][k] != 0.0f) acc = any ? acc + L[i][k] * X[k][j] : L[i][k] * X[k][j], any = true;
      LX[i][j] = acc;
    }
#pragma GCC unroll 8
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 8
    for (int j = 0; j < R; ++j) {
      E acc{};
      bool any = false;
#pragma GCC unroll 8
      for (int k = 0; k < K; ++k)
        if (L[j][k] != 0.0f) acc = any ? acc + LX[i][k] * L[j][k] : LX[i][k] * L[j][k], any = true;
      out[i][j] = acc;
    }
}

// The input and output transforms take kLanes tiles at a time in GCC's vector extension (SSE on
// x86-64; plain scalar code on a machine without vectors): the same float operations per tile.
constexpr int kLanes = 4;
typedef float Lanes __attribute__((vector_size(kLanes * sizeof(float))));

constexpr int64_t kChunkFloats = int64_t{1} << 19;  // V and M of a chunk: 2 MiB, about one core's L2
constexpr int64_t kMinTiles = 32;                   // 32..256 tiles a chunk ran alike (128 channels, 14x14)
constexpr int64_t kMaxTiles = 512;
constexpr int64_t kMinChunks = 8;                   // enough chunks for 2..8 threads, if tiles allow

// y (N, OC, OH, OW) = the 3x3 stride-1 convolution of x (N, C, H, W) with w (OC, C, 3, 3), by F.
template <class F>
void winograd(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  constexpr int m = F::m, a = F::alpha, T = a * a;
  const int64_t OH = s.OH(), OW = s.OW(), TH = (OH + m - 1) / m, TW = (OW + m - 1) / m;
  const int64_t tiles = s.N * TH * TW, OC = s.OC, C = s.C;
  if (tiles <= 0 || OC <= 0) return;

  // U (T, OC, C): U[.][oc][ci] = G w[oc][ci] G^T.
  Scratch<float> U_buf(c.workspace, T * OC * C);
  float* U = U_buf.data();
  c.parallel_for(OC * C, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {  // i = oc * C + ci
      float g[3][3], u[a][a];
      for (int r = 0; r < 3; ++r)
        for (int q = 0; q < 3; ++q) g[r][q] = w[i * 9 + r * 3 + q];
      sandwich(F::G, g, u);
      for (int t = 0; t < T; ++t) U[t * OC * C + i] = u[t / a][t % a];
    }
  });

  // Chunks of P tiles: V and M within kChunkFloats, at least kMinTiles wide, and kMinChunks of them
  // when there are enough tiles.
  int64_t P = std::clamp(kChunkFloats / (T * (C + OC)), kMinTiles, kMaxTiles);
  P = std::min(P, std::max(kMinTiles, (tiles + kMinChunks - 1) / kMinChunks));
  const int64_t count = (tiles + P - 1) / P;

  // One chunk, tiles [t0, t0 + np); pc shares its steps (serial_ctx() when threads take whole chunks).
  auto chunk = [&](const Ctx& pc, int64_t t0, int64_t np) {
    Scratch<float> V_buf(c.workspace, T * C * np), M_buf(c.workspace, T * OC * np);
    float* V = V_buf.data();
    float* M = M_buf.data();
    // Where each tile reads: image n and its top-left input pixel (ih0, iw0), which may lie in the padding.
    Scratch<int64_t> where_buf(c.workspace, 3 * np);
    int64_t* where = where_buf.data();
    for (int64_t p = 0; p < np; ++p) {
      const int64_t tile = t0 + p, n = tile / (TH * TW), ty = tile / TW % TH, tx = tile % TW;
      where[3 * p] = n, where[3 * p + 1] = ty * m - s.pad_h, where[3 * p + 2] = tx * m - s.pad_w;
    }
    // V[.][ci][p] = B^T d B, d the alpha x alpha input tile (zeros outside the image), kLanes tiles at once.
    pc.parallel_for(C, [&](int64_t begin, int64_t end) {
      for (int64_t ci = begin; ci < end; ++ci)
        for (int64_t p = 0; p < np; p += kLanes) {
          const int lanes = static_cast<int>(std::min<int64_t>(kLanes, np - p));
          Lanes d[a][a], v[a][a];
          for (int l = 0; l < kLanes; ++l) {
            const int64_t* at = where + 3 * (p + std::min(l, lanes - 1));  // spare lanes repeat the last tile
            const int64_t ih0 = at[1], iw0 = at[2];
            const float* xc = x + (at[0] * C + ci) * s.H * s.W;
            if (ih0 >= 0 && iw0 >= 0 && ih0 + a <= s.H && iw0 + a <= s.W) {
              for (int r = 0; r < a; ++r)
                for (int q = 0; q < a; ++q) d[r][q][l] = xc[(ih0 + r) * s.W + iw0 + q];
            } else {  // zeros, then the rows [r0, r1) and columns [q0, q1) that lie inside the image
              const int64_t r0 = std::clamp<int64_t>(-ih0, 0, a), r1 = std::clamp<int64_t>(s.H - ih0, r0, a);
              const int64_t q0 = std::clamp<int64_t>(-iw0, 0, a), q1 = std::clamp<int64_t>(s.W - iw0, q0, a);
              for (int r = 0; r < a; ++r)
                for (int q = 0; q < a; ++q) d[r][q][l] = 0.0f;
              for (int64_t r = r0; r < r1; ++r)
                for (int64_t q = q0; q < q1; ++q) d[r][q][l] = xc[(ih0 + r) * s.W + iw0 + q];
            }
          }
          sandwich(F::BT, d, v);
          for (int t = 0; t < T; ++t) {
            float* out = V + (t * C + ci) * np + p;
            if (lanes == kLanes) __builtin_memcpy(out, &v[t / a][t % a], sizeof(Lanes));
            else
              for (int l = 0; l < lanes; ++l) out[l] = v[t / a][t % a][l];
          }
        }
    });
    // M[t] (OC, np) = U[t] (OC, C) @ V[t] (C, np), one one-thread GEMM each.
    pc.parallel_for(T, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        gemm(serial_ctx(), false, false, OC, np, C, 1.0f, U + t * OC * C, V + t * C * np, 0.0f, M + t * OC * np);
    });
    // y tile = A^T M A, cut at the output's edge, kLanes tiles at once.
    pc.parallel_for(OC, [&](int64_t begin, int64_t end) {
      for (int64_t oc = begin; oc < end; ++oc)
        for (int64_t p = 0; p < np; p += kLanes) {
          const int lanes = static_cast<int>(std::min<int64_t>(kLanes, np - p));
          Lanes mt[a][a], yt[m][m];
          for (int t = 0; t < T; ++t) {
            const float* in = M + (t * OC + oc) * np + p;
            if (lanes == kLanes) __builtin_memcpy(&mt[t / a][t % a], in, sizeof(Lanes));
            else
              for (int l = 0; l < kLanes; ++l) mt[t / a][t % a][l] = in[std::min(l, lanes - 1)];
          }
          sandwich(F::AT, mt, yt);
          for (int l = 0; l < lanes; ++l) {
            const int64_t* at = where + 3 * (p + l);
            const int64_t oh0 = at[1] + s.pad_h, ow0 = at[2] + s.pad_w;  // the tile's first output
            float* yc = y + (at[0] * OC + oc) * OH * OW;
            const int64_t rows = std::min<int64_t>(m, OH - oh0), cols = std::min<int64_t>(m, OW - ow0);
            for (int64_t r = 0; r < rows; ++r)
              for (int64_t q = 0; q < cols; ++q) yc[(oh0 + r) * OW + ow0 + q] = yt[r][q][l];
          }
        }
    });
  };

  if (count >= c.threads)
    c.parallel_for(count, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) chunk(serial_ctx(), i * P, std::min(P, tiles - i * P));
    });
  else
    for (int64_t i = 0; i < count; ++i) chunk(c, i * P, std::min(P, tiles - i * P));
}

// dx = dy convolved with w turned by 180 degrees, channels swapped: wt[ci][oc][kh][kw] = w[oc][ci][2-kh][2-kw],
// padding 2 - pad (so that the output is H x W again).
template <class F>
void winograd_backward_data(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const Conv2dShape t{s.N, s.OC, s.OH(), s.OW(), s.C, 3, 3, 1, 1, 2 - s.pad_h, 2 - s.pad_w};
  Scratch<float> wt_buf(c.workspace, s.C * s.OC * 9);
  float* wt = wt_buf.data();
  for (int64_t oc = 0; oc < s.OC; ++oc)
    for (int64_t ci = 0; ci < s.C; ++ci)
      for (int k = 0; k < 9; ++k) wt[(ci * s.OC + oc) * 9 + k] = w[(oc * s.C + ci) * 9 + 8 - k];
  winograd<F>(c, t, dy, wt, dx);
}

}  // namespace

bool conv2d_winograd_fits(const Conv2dShape& s) {
  return s.KH == 3 && s.KW == 3 && s.stride_h == 1 && s.stride_w == 1 && s.OH() >= 1 && s.OW() >= 1;
}
// backward_data's padding 2 - pad must not be negative.
static bool backward_fits(const Conv2dShape& s) { return conv2d_winograd_fits(s) && s.pad_h <= 2 && s.pad_w <= 2; }

void conv2d_forward_winograd(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  if (!conv2d_winograd_fits(s)) return conv2d_forward_im2col(c, s, x, w, y);
  winograd<F4>(c, s, x, w, y);
}
void conv2d_backward_data_winograd(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (!backward_fits(s)) return conv2d_backward_data_im2col(c, s, dy, w, dx);
  winograd_backward_data<F4>(c, s, dy, w, dx);
}
void conv2d_forward_winograd2(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  if (!conv2d_winograd_fits(s)) return conv2d_forward_im2col(c, s, x, w, y);
  winograd<F2>(c, s, x, w, y);
}
void conv2d_backward_data_winograd2(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (!backward_fits(s)) return conv2d_backward_data_im2col(c, s, dy, w, dx);
  winograd_backward_data<F2>(c, s, dy, w, dx);
}

}  // namespace d2l::kernels::cpu
