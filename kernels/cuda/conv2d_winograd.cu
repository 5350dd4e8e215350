// conv2d kernel3 on the GPU: Winograd's minimal filtering for 3x3 stride-1 convolutions (any padding),
// the CUDA twin of kernels/cpu/conv2d_winograd.cpp (read that file first: it says where the matrices
// come from and what the method costs). The family, and the choice between its members, are in
// conv2d.cu.
//
// F(m x m, 3x3) computes an m x m output tile from an alpha x alpha input tile d (alpha = m + 2):
//     U = G g G^T   (the filter, alpha x alpha)      V = B^T d B   (the input tile, alpha x alpha)
//     M[t] (OC, tiles) = U[t] (OC, C) @ V[t] (C, tiles)   for each of the alpha^2 entries t
//     Y = A^T M A   (the output tile, m x m)
// F(4x4, 3x3) (`winograd`, alpha = 6) and F(2x2, 3x3) (`winograd2`, alpha = 4), as on the CPU.
//
// The steps, one launch each:
//   winograd_filter_kernel   U (alpha^2, OC, C), once per call
//   winograd_input_kernel    V (alpha^2, C, tiles) for a chunk of tiles
//   the alpha^2 GEMMs        M (alpha^2, OC, tiles), with the GEMM set_conv2d_gemm chose (conv2d_gemm:
//                            cuBLAS or the tiled kernels, as im2col's)
//   winograd_output_kernel   y, from M
// A tile is (image n, tile row, tile column), numbered over all the images. V and M of all the tiles
// at once can be large (ResNet-18's first stage at batch 256: 50176 tiles, 36 * 128 floats each), so
// the tiles are cut into chunks whose V and M fit in a workspace of at most
// conv2d_winograd_workspace() floats (common.cuh's ScratchBuffer, as im2col's col); the chunks run
// one after another.
//
// backward_data of a 3x3 stride-1 convolution is itself one: dx = dy convolved with the kernel turned
// by 180 degrees, input and output channels swapped, padding 2 - pad. The filter transform reads w
// that way (its `rotate` flag), so no turned copy of w is made. backward_weight is im2col's.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <algorithm>
#include <atomic>

// Full unrolling of the small transform loops: the matrices are then constants, and the products by
// 0 and 1 vanish (nvcc: #pragma unroll; g++ for the emulation: #pragma GCC unroll).
#ifdef __CUDACC__
#define D2L_UNROLL _Pragma("unroll")
#else
#define D2L_UNROLL _Pragma("GCC unroll 8")
#endif

namespace D2L_CUDA_NS {

namespace winograd {

// The matrices of kernels/cpu/conv2d_winograd.cpp, entry for entry (a copy: that file keeps its own in
// an unnamed namespace). Here they are non-static members, so that a kernel can hold the struct as a
// local constant (`constexpr F4 f{};`): a static array member could not be read from device code.

// F(2x2, 3x3): points 0, 1, -1 (and infinity).
struct F2 {
  static constexpr int m = 2, alpha = 4;
  float BT[alpha][alpha] = {
      {1, 0, -1, 0},
      {0, 1, 1, 0},
      {0, -1, 1, 0},
      {0, 1, 0, -1},
  };
  float G[alpha][3] = {
      {1, 0, 0},
      {0.5f, 0.5f, 0.5f},
      {0.5f, -0.5f, 0.5f},
      {0, 0, 1},
  };
  float AT[m][alpha] = {
      {1, 1, 1, 0},
      {0, 1, -1, -1},
  };
};

// F(4x4, 3x3): points 0, 1, -1, 2, -2 (and infinity).
struct F4 {
  static constexpr int m = 4, alpha = 6;
  float BT[alpha][alpha] = {
      {4, 0, -5, 0, 1, 0},
      {0, -4, -4, 1, 1, 0},
      {0, 4, -4, -1, 1, 0},
      {0, -2, -1, 2, 1, 0},
      {0, 2, -1, -2, 1, 0},
      {0, 4, 0, -5, 0, 1},
  };
  float G[alpha][3] = {
      {1.0f / 4, 0, 0},
      {-1.0f / 6, -1.0f / 6, -1.0f / 6},
      {-1.0f / 6, 1.0f / 6, -1.0f / 6},
      {1.0f / 24, 1.0f / 12, 1.0f / 6},
      {1.0f / 24, -1.0f / 12, 1.0f / 6},
      {0, 0, 1},
  };
  float AT[m][alpha] = {
      {1, 1, 1, 1, 1, 0},
      {0, 1, -1, 2, -2, 0},
      {0, 1, 1, 4, 4, 0},
      {0, 1, -1, 8, -8, 1},
  };
};

// out (R, R) = L (R, K) @ X (K, K) @ L^T: the shape of all three transforms (L = B^T, G or A^T), as
// the CPU's sandwich. The entries of L that are 0 are skipped (after unrolling, at compile time).
template <int R, int K>
__device__ __forceinline__ void sandwich(const float (&L)[R][K], const float (&X)[K][K], float (&out)[R][R]) {
  float LX[R][K];
  D2L_UNROLL
  for (int i = 0; i < R; ++i) {
    D2L_UNROLL
    for (int j = 0; j < K; ++j) {
      float acc = 0.0f;
      D2L_UNROLL
      for (int k = 0; k < K; ++k)
        if (L[i][k] != 0.0f) acc += L[i][k] * X[k][j];
      LX[i][j] = acc;
    }
  }
  D2L_UNROLL
  for (int i = 0; i < R; ++i) {
    D2L_UNROLL
    for (int j = 0; j < R; ++j) {
      float acc = 0.0f;
      D2L_UNROLL
      for (int k = 0; k < K; ++k)
        if (L[j][k] != 0.0f) acc += LX[i][k] * L[j][k];
      out[i][j] = acc;
    }
  }
}

}  // namespace winograd

// Filter transform: U[t][o][i] = (G g G^T)[t], g the 3x3 filter from input channel i to output channel
// o of the convolution being computed, which has Cout output and Cin input channels:
//   forward         g = w[o][i]                          (w is (Cout, Cin, 3, 3))
//   rotate (dx)     g[r][q] = w[i][o][2 - r][2 - q]      (w is (Cin, Cout, 3, 3): the forward's weights)
// Threads: one (o, i) per thread per grid-stride step, e = o * Cin + i; each writes its alpha^2 values,
// neighbouring threads neighbouring entries of each U[t].
template <class F>
__global__ void winograd_filter_kernel(int64_t Cout, int64_t Cin, bool rotate, const float* __restrict__ w,
                                       float* __restrict__ U) {
  constexpr F f{};
  constexpr int a = F::alpha;
  const int64_t total = Cout * Cin, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t o = e / Cin, i = e % Cin;
    const float* we = rotate ? w + (i * Cout + o) * 9 : w + e * 9;
    float g[3][3], u[a][a];
    for (int k = 0; k < 9; ++k) g[k / 3][k % 3] = rotate ? we[8 - k] : we[k];
    winograd::sandwich(f.G, g, u);
    D2L_UNROLL
    for (int t = 0; t < a * a; ++t) U[t * total + e] = u[t / a][t % a];
  }
}

// Input transform of the tiles [t0, t0 + np): V[t][ci][p] = (B^T d B)[t], d the alpha x alpha input tile
// of tile t0 + p in channel ci (zeros where it lies in the padding or past the image). Tile tile is
// image n = tile / (TH * TW), tile row ty, column tx; its first input pixel is (ty*m - pad_h, tx*m - pad_w).
// Threads: one (ci, p) per thread per grid-stride step, e = ci * np + p: neighbouring threads take
// neighbouring tiles and write neighbouring entries of V.
template <class F>
__global__ void winograd_input_kernel(Conv2dShape s, int64_t TH, int64_t TW, int64_t t0, int64_t np,
                                      const float* __restrict__ x, float* __restrict__ V) {
  constexpr F f{};
  constexpr int m = F::m, a = F::alpha;
  const int64_t total = s.C * np, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t ci = e / np, p = e % np, tile = t0 + p;
    const int64_t n = tile / (TH * TW), ty = tile / TW % TH, tx = tile % TW;
    const int64_t ih0 = ty * m - s.pad_h, iw0 = tx * m - s.pad_w;
    const float* xc = x + (n * s.C + ci) * s.H * s.W;
    float d[a][a], v[a][a];
    D2L_UNROLL
    for (int r = 0; r < a; ++r) {
      D2L_UNROLL
      for (int q = 0; q < a; ++q) {
        const int64_t ih = ih0 + r, iw = iw0 + q;
        d[r][q] = (ih >= 0 && ih < s.H && iw >= 0 && iw < s.W) ? xc[ih * s.W + iw] : 0.0f;
      }
    }
    winograd::sandwich(f.BT, d, v);
    D2L_UNROLL
    for (int t = 0; t < a * a; ++t) V[(t * s.C + ci) * np + p] = v[t / a][t % a];
  }
}

// Output transform of the tiles [t0, t0 + np): the m x m output tile of tile t0 + p in channel oc is
// A^T M A, M the alpha x alpha values M[t][oc][p]; it is written to y (N, OC, OH, OW), cut at the
// output's edge. Threads: one (oc, p) per thread per grid-stride step, e = oc * np + p: neighbouring
// threads read neighbouring entries of M.
template <class F>
__global__ void winograd_output_kernel(int64_t OC, int64_t OH, int64_t OW, int64_t TH, int64_t TW, int64_t t0,
                                       int64_t np, const float* __restrict__ M, float* __restrict__ y) {
  constexpr F f{};
  constexpr int m = F::m, a = F::alpha;
  const int64_t total = OC * np, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t oc = e / np, p = e % np, tile = t0 + p;
    const int64_t n = tile / (TH * TW), oh0 = tile / TW % TH * m, ow0 = tile % TW * m;
    float mt[a][a], yt[m][m];
    D2L_UNROLL
    for (int t = 0; t < a * a; ++t) mt[t / a][t % a] = M[t * total + e];
    winograd::sandwich(f.AT, mt, yt);
    float* yc = y + (n * OC + oc) * OH * OW;
    D2L_UNROLL
    for (int r = 0; r < m; ++r) {
      D2L_UNROLL
      for (int q = 0; q < m; ++q)
        if (oh0 + r < OH && ow0 + q < OW) yc[(oh0 + r) * OW + ow0 + q] = yt[r][q];
    }
  }
}

namespace {

// 64 MiB: ResNet-18's first stage at batch 256 in 4 chunks of 3640 tiles (GEMMs of 64 x 3640 x 64). Not
// tuned on a GPU yet: fewer, wider chunks give wider GEMMs for more memory.
std::atomic<int64_t> g_workspace_floats{int64_t{1} << 24};

// y (N, OC, OH, OW) = the 3x3 stride-1 convolution s of x (N, C, H, W) with the filters w, by F; w is
// read as winograd_filter_kernel says (rotate: the forward's weights, for backward_data).
template <class F>
void winograd_conv(Stream stream, const Conv2dShape& s, bool rotate, const float* x, const float* w, float* y) {
  constexpr int m = F::m, a = F::alpha, T = a * a;
  const int64_t OH = s.OH(), OW = s.OW(), TH = (OH + m - 1) / m, TW = (OW + m - 1) / m;
  const int64_t tiles = s.N * TH * TW, OC = s.OC, C = s.C;
  if (tiles <= 0 || OC <= 0) return;
  if (C <= 0) return fill(stream, y, s.N * OC * OH * OW, 0.0f);  // no input channels: sums of nothing

  ScratchBuffer<float> U(stream, T * OC * C);
  D2L_LAUNCH_OVER(OC * C, stream, winograd_filter_kernel<F>, OC, C, rotate, w, U.data());

  // Chunks of P tiles: V (T, C, P) and M (T, OC, P) within the workspace, at least one tile.
  const int64_t P = std::clamp<int64_t>(conv2d_winograd_workspace() / (T * (C + OC)), 1, tiles);
  ScratchBuffer<float> V(stream, T * C * P), M(stream, T * OC * P);
  for (int64_t t0 = 0; t0 < tiles; t0 += P) {
    const int64_t np = std::min(P, tiles - t0);
    D2L_LAUNCH_OVER(C * np, stream, winograd_input_kernel<F>, s, TH, TW, t0, np, x, V.data());
    // M[t] (OC, np) = U[t] (OC, C) @ V[t] (C, np)
    for (int t = 0; t < T; ++t)
      conv2d_gemm(stream, false, false, OC, np, C, 1.0f, U.data() + t * OC * C, V.data() + t * C * np, 0.0f,
                  M.data() + t * OC * np);
    D2L_LAUNCH_OVER(OC * np, stream, winograd_output_kernel<F>, OC, OH, OW, TH, TW, t0, np, M.data(), y);
  }
}

// dx = dy convolved with w turned by 180 degrees, channels swapped, padding 2 - pad: a convolution of
// dy (N, OC, OH, OW) into OH + 2 (2 - pad) - 2 = H rows (likewise columns) of C channels.
template <class F>
void winograd_backward_data(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const Conv2dShape t{s.N, s.OC, s.OH(), s.OW(), s.C, 3, 3, 1, 1, 2 - s.pad_h, 2 - s.pad_w};
  winograd_conv<F>(stream, t, true, dy, w, dx);
}

// The shapes kernel3 takes: the CPU's rule (3x3, stride 1); backward_data's padding 2 - pad must not be
// negative.
bool forward_fits(const Conv2dShape& s) { return ::d2l::kernels::cpu::conv2d_winograd_fits(s); }
bool backward_fits(const Conv2dShape& s) { return forward_fits(s) && s.pad_h <= 2 && s.pad_w <= 2; }

}  // namespace

void set_conv2d_winograd_workspace(int64_t floats) { g_workspace_floats = std::max<int64_t>(floats, 1); }
int64_t conv2d_winograd_workspace() { return g_workspace_floats.load(std::memory_order_relaxed); }

// The launchers, with the CPU's names; a shape kernel3 does not take runs kernel2 (im2col).
void conv2d_forward_winograd(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  if (!forward_fits(s)) return conv2d_forward_im2col(stream, s, x, w, y);
  winograd_conv<winograd::F4>(stream, s, false, x, w, y);
}
void conv2d_backward_data_winograd(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (!backward_fits(s)) return conv2d_backward_data_im2col(stream, s, dy, w, dx);
  winograd_backward_data<winograd::F4>(stream, s, dy, w, dx);
}
void conv2d_forward_winograd2(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  if (!forward_fits(s)) return conv2d_forward_im2col(stream, s, x, w, y);
  winograd_conv<winograd::F2>(stream, s, false, x, w, y);
}
void conv2d_backward_data_winograd2(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (!backward_fits(s)) return conv2d_backward_data_im2col(stream, s, dy, w, dx);
  winograd_backward_data<winograd::F2>(stream, s, dy, w, dx);
}

}  // namespace D2L_CUDA_NS
