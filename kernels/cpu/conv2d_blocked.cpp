// conv2d kernel4: a direct convolution on a channel-blocked filter, vectorised over output channels.
// The family, its reference (kernel1) and the choice between the members are in conv2d.cpp.
//
// kernel1 computes one output at a time: per output, C*KH*KW scalar products. kernel4 computes a tile
// of R output positions for a block of V output channels at once, in R vector registers of V floats:
//
//     for each tap (ci, kh, kw) of the window:          (kernel1's loops, flattened)
//       wv = wb[ob][ci][kh][kw][0..V)                  one vector load: V filters' tap
//       for r in 0..R:  acc[r] += x(position r, ci, kh, kw) * wv     one broadcast, one FMA
//
// so each x value read serves V output channels and each filter vector serves R positions: the reuse
// a GEMM's register tile gets, with no im2col buffer (kernel2 copies every input KH*KW times).
// The layout that makes wv one load is the filter's, blocked by output channels (oneDNN calls it
// OIhw8o / OIhw16o):
//     wb[ob][ci][kh][kw][v] = w[ob*V + v][ci][kh][kw]       (0 for ob*V + v >= OC)
// repacked once per call (OC*C*KH*KW floats). x and y keep the framework's NCHW layout: x is copied
// zero-padded per image (so the loop has no bounds tests), and each finished tile (R positions x V
// channels) is written to y's V planes.
//
// The vector width comes from the CPU, at run time: AVX-512 (V = 16), AVX2 with FMA (V = 8) or a
// portable build (V = 8 as two 4-float vectors: SSE, or whatever the compiler makes of GCC's vector
// types). The loops (conv2d_blocked_items.hpp) are compiled three times, each in its ISA's target
// region; start-up reads the CPU's features (__builtin_cpu_supports) and set_conv2d_blocked_isa can
// force one (tests run every one the CPU has). Each output is one sum in the order ci, kh, kw, so
// results do not depend on the thread count; they differ between ISAs only in FMA's rounding.
//
// backward_data of a stride-1 convolution is itself one: dx = dy convolved with the filter turned by
// 180 degrees, input and output channels swapped, padding K - 1 - pad (the repacking turns it).
// backward_weight is the same tile with the roles swapped: R taps of the window x V output channels,
// summed over positions (per image, then over the images). Other strides' backward_data, 1x1 windows'
// backward_weight and first layers (C < 4) run kernel2's passes.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

constexpr int kTail = 4;   // positions per tile at the end of a plane (fewer wasted than a full tile)
constexpr int kMaxR = 16;  // no ISA's tile is longer

struct Plan {
  Conv2dShape s;
  int64_t Hp, Wp, P;  // padded input size; output positions per plane
};

// What every item of one call shares: items are (image n, block ob of V output channels), in that
// order, and wb is the repacked filter.
struct Job {
  Plan pl;
  const float* x;
  const float* wb;
  float* y;
  const Workspace* workspace;
  const int64_t* tap;  // tap[(ci*KH + kh)*KW + kw] = ci*Hp*Wp + kh*Wp + kw: where each tap reads in xp
  int64_t window;      // C*KH*KW taps
};

// xp[ci][ih + pad_h][iw + pad_w] = x_n[ci][ih][iw], 0 around: the loops need no bounds tests.
void pad_image(const Conv2dShape& s, const Plan& pl, const float* x_n, float* xp) {
  std::memset(xp, 0, static_cast<size_t>(s.C * pl.Hp * pl.Wp) * sizeof(float));
  for (int64_t ci = 0; ci < s.C; ++ci)
    for (int64_t ih = 0; ih < s.H; ++ih)
      std::memcpy(xp + (ci * pl.Hp + ih + s.pad_h) * pl.Wp + s.pad_w, x_n + (ci * s.H + ih) * s.W,
                  static_cast<size_t>(s.W) * sizeof(float));
}

// Writes a tile's `count` positions of its V channels (those below OC) into y's planes.
[[gnu::always_inline]] inline void store_tile(const Conv2dShape& s, int64_t P, int64_t V, const float* out,
                                              int64_t count, float* y_n, int64_t oc0, int64_t p0) {
  const int64_t channels = std::min(V, s.OC - oc0);
  for (int64_t v = 0; v < channels; ++v) {
    float* yrow = y_n + (oc0 + v) * P + p0;
    for (int64_t r = 0; r < count; ++r) yrow[r] = out[r * V + v];
  }
}

// backward_weight's items: the input channels ci, for one block ob of V output channels; dyb is that
// block's dy, dyb[n][p][v] = dy[n][ob*V + v][p] (0 past OC), and tapoff[k] = kh*Wp + kw (the tap list is padded
// past KH*KW with repeats of the last tap, computed and not stored).
struct WeightJob {
  Plan pl;
  const float* x;
  const float* dyb;
  float* dw;
  const Workspace* workspace;
  const int64_t* tapoff;
  int64_t ob;  // the block of output channels this pass computes
};

// xp[n][ih + pad_h][iw + pad_w] = x[n][ci][ih][iw] for every image n, 0 around.
void pad_channel(const Conv2dShape& s, const Plan& pl, const float* x, int64_t ci, float* xp) {
  std::memset(xp, 0, static_cast<size_t>(s.N * pl.Hp * pl.Wp) * sizeof(float));
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t ih = 0; ih < s.H; ++ih)
      std::memcpy(xp + (n * pl.Hp + ih + s.pad_h) * pl.Wp + s.pad_w, x + ((n * s.C + ci) * s.H + ih) * s.W,
                  static_cast<size_t>(s.W) * sizeof(float));
}

// Writes `count` taps k0.. of a weight tile (out[r][v]) into dw[ob*V + v][ci][k0 + r], for v below OC.
[[gnu::always_inline]] inline void store_weight_tile(const Conv2dShape& s, int64_t V, const float* out, int64_t count,
                                                     float* dw, int64_t ob, int64_t ci, int64_t k0) {
  const int64_t KK = s.KH * s.KW, channels = std::min(V, s.OC - ob * V);
  for (int64_t v = 0; v < channels; ++v)
    for (int64_t r = 0; r < count; ++r) dw[((ob * V + v) * s.C + ci) * KK + k0 + r] = out[r * V + v];
}

// The three builds of the loops (conv2d_blocked_items.hpp): 16-float vectors and 12 accumulators on
// AVX-512 (32 registers), 8-float vectors and 12 accumulators on AVX2 (16 registers: 12, the filter and
// a broadcast), and the portable one: 4-float vectors, two per block of 8 channels, 4 positions.
#if defined(__x86_64__) && defined(__GNUC__)
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
namespace avx512 {
constexpr int VW = 16, NV = 1, R = 12;
#include "conv2d_blocked_items.hpp"
}  // namespace avx512
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
constexpr int VW = 8, NV = 1, R = 12;
#include "conv2d_blocked_items.hpp"
}  // namespace avx2
#pragma GCC pop_options
#endif
namespace portable {
constexpr int VW = 4, NV = 2, R = 4;
#include "conv2d_blocked_items.hpp"
}  // namespace portable
using Items = void (*)(const Job&, int64_t, int64_t);
using WeightItems = void (*)(const WeightJob&, int64_t, int64_t);

// The filter kernel4 reads: w itself (forward), or, for backward_data, w turned by 180 degrees with
// its input and output channels swapped (conv2d_backward_data_blocked).
enum class Filter { as_is, flipped };

// Repacks the filter into blocks of V output channels, then runs the items over the threads.
void forward_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, Filter filter, float* y,
                     int64_t V, Items run) {
  const int64_t OB = (s.OC + V - 1) / V, KK = s.KH * s.KW;
  Scratch<float> wb_buf(c.workspace, OB * s.C * KK * V);
  float* wb = wb_buf.data();
  // w's index of tap (oc, ci, kh, kw) of the filter this convolution applies
  const auto at = [&](int64_t oc, int64_t ci, int64_t kh, int64_t kw) {
    return filter == Filter::as_is ? ((oc * s.C + ci) * s.KH + kh) * s.KW + kw
                                   : ((ci * s.OC + oc) * s.KH + (s.KH - 1 - kh)) * s.KW + (s.KW - 1 - kw);
  };
  c.parallel_for(OB, [&](int64_t b, int64_t e) {  // wb[ob][ci][kh][kw][v] = tap (ob*V + v, ci, kh, kw)
    for (int64_t ob = b; ob < e; ++ob)
      for (int64_t v = 0; v < V; ++v)  // (w is read along its rows: one filter at a time)
        for (int64_t ci = 0; ci < s.C; ++ci)
          for (int64_t kh = 0; kh < s.KH; ++kh)
            for (int64_t kw = 0; kw < s.KW; ++kw) {
              const int64_t oc = ob * V + v;
              wb[(((ob * s.C + ci) * s.KH + kh) * s.KW + kw) * V + v] = oc < s.OC ? w[at(oc, ci, kh, kw)] : 0.0f;
            }
  });
  const Plan pl{s, s.H + 2 * s.pad_h, s.W + 2 * s.pad_w, s.OH() * s.OW()};
  std::vector<int64_t> tap(static_cast<size_t>(s.C * KK));
  for (int64_t ci = 0; ci < s.C; ++ci)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) tap[(ci * s.KH + kh) * s.KW + kw] = (ci * pl.Hp + kh) * pl.Wp + kw;
  const Job job{pl, x, wb, y, c.workspace, tap.data(), s.C * KK};
  c.parallel_for(s.N * OB, [&](int64_t b, int64_t e) { run(job, b, e); });
}

void forward_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, Filter filter, float* y) {
  switch (conv2d_blocked_isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case VectorIsa::avx512: return forward_blocked(c, s, x, w, filter, y, avx512::V, avx512::items);
    case VectorIsa::avx2: return forward_blocked(c, s, x, w, filter, y, avx2::V, avx2::items);
#endif
    default: return forward_blocked(c, s, x, w, filter, y, portable::V, portable::items);
  }
}

// backward_weight: dy into blocks of V output channels, then the items over the threads. Each dw
// value is one sum over the images and positions in order: the same bits for any thread count.
void backward_weight_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw, int64_t V,
                             WeightItems run) {
  const int64_t OB = (s.OC + V - 1) / V, KK = s.KH * s.KW;
  const Plan pl{s, s.H + 2 * s.pad_h, s.W + 2 * s.pad_w, s.OH() * s.OW()};
  std::vector<int64_t> tapoff(static_cast<size_t>(KK + kMaxR));
  for (int64_t k = 0; k < KK + kMaxR; ++k) {
    const int64_t kk = std::min(k, KK - 1);
    tapoff[k] = (kk / s.KW) * pl.Wp + kk % s.KW;
  }
  Scratch<float> dyb_buf(c.workspace, s.N * pl.P * V);  // one block's dy at a time: 1/OB of dy
  float* dyb = dyb_buf.data();
  for (int64_t ob = 0; ob < OB; ++ob) {
    c.parallel_for(s.N, [&](int64_t b, int64_t e) {  // dyb[n][p][v] = dy[n][ob*V + v][p]
      for (int64_t n = b; n < e; ++n)
        for (int64_t v = 0; v < V; ++v) {
          const int64_t oc = ob * V + v;
          const float* src = dy + (n * s.OC + oc) * pl.P;
          float* out = dyb + n * pl.P * V + v;
          for (int64_t p = 0; p < pl.P; ++p) out[p * V] = oc < s.OC ? src[p] : 0.0f;
        }
    });
    const WeightJob job{pl, x, dyb, dw, c.workspace, tapoff.data(), ob};
    c.parallel_for(s.C, [&](int64_t b, int64_t e) { run(job, b, e); });
  }
}

std::atomic<VectorIsa> g_isa{best_vector_isa()};

}  // namespace

VectorIsa conv2d_blocked_isa() { return g_isa.load(std::memory_order_relaxed); }
void set_conv2d_blocked_isa(VectorIsa isa) { g_isa.store(isa, std::memory_order_relaxed); }

void conv2d_forward_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  forward_blocked(c, s, x, w, Filter::as_is, y);
}

void conv2d_backward_weight_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  // A tile of R taps that would be nearly all repeats (1x1), or a first layer's few input channels (each
  // item then streams all of dy for one channel): kernel2's, which ran faster there (bench/README.md).
  if (s.KH * s.KW < 4 || s.C < 4) return conv2d_backward_weight_im2col(c, s, x, dy, dw);
  switch (conv2d_blocked_isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case VectorIsa::avx512: return backward_weight_blocked(c, s, x, dy, dw, avx512::V, avx512::weight_items);
    case VectorIsa::avx2: return backward_weight_blocked(c, s, x, dy, dw, avx2::V, avx2::weight_items);
#endif
    default: return backward_weight_blocked(c, s, x, dy, dw, portable::V, portable::weight_items);
  }
}

// (and C >= 4: into fewer channels, as a first layer's backward_data would be, kernel2 ran 3x faster)
bool conv2d_blocked_fits_backward_data(const Conv2dShape& s) {
  return s.stride_h == 1 && s.stride_w == 1 && s.pad_h <= s.KH - 1 && s.pad_w <= s.KW - 1 && s.C >= 4;
}

// dx = dy (N, OC, OH, OW) convolved with wr[ci][oc][kh][kw] = w[oc][ci][KH-1-kh][KW-1-kw], padding
// K - 1 - pad: a forward convolution from OC channels to C, whose filter the repacking turns.
void conv2d_backward_data_blocked(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  if (!conv2d_blocked_fits_backward_data(s)) return conv2d_backward_data_im2col(c, s, dy, w, dx);
  const Conv2dShape t{s.N, s.OC, s.OH(), s.OW(), s.C, s.KH, s.KW, 1, 1, s.KH - 1 - s.pad_h, s.KW - 1 - s.pad_w};
  forward_blocked(c, t, dy, w, Filter::flipped, dx);
}

}  // namespace d2l::kernels::cpu
