// conv2d's kernel5, implicit GEMM: each pass of kernels/cuda/conv2d.cu's family (forward,
// backward_data, backward_weight) as one GEMM over the whole batch, the im2col index arithmetic done
// while shared-memory tiles are loaded. In a file of its own as kernel3 is (conv2d_winograd.cu);
// conv2d.cu's table of passes runs it for --conv implicit and, in TF32, for automatic.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <stdexcept>

// kernel5's loops over its register tiles and fragments, unrolled (nvcc: #pragma unroll; g++ for the
// emulation: #pragma GCC unroll), so the arrays they index stay in registers.
#ifdef __CUDACC__
#define D2L_CONV_UNROLL _Pragma("unroll")
#else
#define D2L_CONV_UNROLL _Pragma("GCC unroll 8")
#endif

namespace D2L_CUDA_NS {

// ======== kernel5: implicit GEMM, the whole batch as one GEMM ========
//
// kernel2 writes im2col's matrix out and multiplies it one image at a time. kernel5 multiplies the
// same matrix for the whole batch without ever storing it (cuDNN's IMPLICIT_GEMM): every element of
// a shared-memory tile is computed from its GEMM coordinates while the tile is loaded. Each pass is
// one GEMM C = A @ B, M x Ncol, summed over Kdim; sh, sw are the strides, ph, pw the paddings:
//
//   forward          y:  row p = (n, oh, ow), col oc, sum over k = (ci, kh, kw)   M = N*OH*OW, Kdim = C*KH*KW
//                    A(p, k)  = x[n][ci][oh*sh - ph + kh][ow*sw - pw + kw]   (0 in the padding)
//                    B(k, oc) = w[oc][ci][kh][kw]                            (w viewed as (OC, Kdim))
//   backward_data    dx: row q = (n, ih, iw), col ci, sum over k = (oc, kh, kw)   M = N*H*W, Kdim = OC*KH*KW
//                    A(q, k)  = dy[n][oc][oh][ow] where oh*sh = ih + ph - kh and ow*sw = iw + pw - kw
//                               (0 where that is no whole output position: kernel1's gathered form)
//                    B(k, ci) = w[oc][ci][kh][kw]
//                    (this form for stride 1; a stride above 1 splits it into dense GEMMs, one per parity
//                    class of (ih, iw), without the zeros: BackwardDataStrided below)
//   backward_weight  dw: row oc, col j = (ci, kh, kw), sum over p = (n, oh, ow)   M = OC, Kdim = N*OH*OW
//                    A(oc, p) = dy[n][oc][oh][ow]
//                    B(p, j)  = x[n][ci][oh*sh - ph + kh][ow*sw - pw + kw]   (0 in the padding)
//
// Three variants compute these GEMMs, with the same passes, tables and stores:
//   fp32  (SIMT)   a 256-thread block computes a 128x128 (or 64x64) tile of C, each thread an 8x8 (4x4)
//                  micro-tile in registers (matmul.cu's kernel3/kernel4 idea), from 16-deep tiles of A
//                  and B in shared memory: plain FP32 multiply-adds, kernel1's accuracy.
//   tf32  (tensor cores, sm_80 and later)  a 256-thread block (8 warps as 2 x 4) computes a 128x128 (or
//                  64x64) tile of C from 32-deep tiles; each warp holds 4x2 (2x1) accumulator fragments
//                  of 16x16 and feeds them with wmma's m16n16k8 TF32 products. The tiles' values are
//                  rounded to TF32 (10-bit mantissa) as they are stored in shared memory; the sums are
//                  FP32. Its results differ from FP32's by about 2^-11 of sum |a||b| per output.
//   mma   (tensor cores through PTX, sm_80 and later; set_conv2d_implicit_core, --gemm mma)  the tf32
//                  variant's arithmetic on another core: 128x128 (or 128x64) tiles of 32-deep slices
//                  copied by cp.async straight into swizzled shared memory, three in flight, and
//                  mma.sync m16n8k8 on fragments read as PTX lays them out (conv2d_implicit_mma_kernel).
// conv2d_*_implicit run tf32 (on the wmma core unless set_conv2d_implicit_core says mma) when
// kernels::cpu::precision() is tf32, or automatic on a real GPU of compute capability 8.0 or more; else
// fp32 (automatic under the emulation, or an older GPU).
//
// The index arithmetic, once per tile rather than once per element. All sizes are 32-bit ints (the
// launchers refuse tensors of 2^31 elements or more). A GEMM index is a mixed-radix number:
//   an output position p = (n, oh, ow) in radices (OH, OW), an input one (n, ih, iw) in (H, W),
//   a filter tap k = (c, kh, kw) in (KH, KW),  a column j of backward_weight likewise (ci, kh, kw).
// * Rows and columns: the block's BM rows and BN columns are decomposed once, at the start, into a
//   table in shared memory (Ctx: the offset of the row's image, its window's corner oh*sh - ph and
//   ow*sw - pw, and where its output goes); a load then adds a table entry to the tap's part.
// * The sum index k: each thread loads the same few k offsets of every slice (k0 + kk), so it keeps
//   them decomposed (KPos: k and its digits hi, mid, lo) and moves each by the slice depth BK from one
//   slice to the next with carries (advance: BK written once in the same radices, no division).
// E.g. forward, A(p, k): the row table gives base = n*C*H*W, h = oh*sh - ph, w = ow*sw - pw; the tap
// gives (ci, kh, kw) = (hi, mid, lo); then ih = h + kh, iw = w + kw, and inside the image the value is
// x[base + (ci*H + ih)*W + iw].
//
// Tiles and loads: a slice is A (BM x BK) and B (BK x BN), stored k-major (As[k][m], Bs[k][n], rows
// padded by 4 floats). The 8 warps' lanes run along whichever index is contiguous in memory: along
// the rows for forward's and backward_data's A (neighbouring output or input positions: neighbouring
// x or dy), along k for backward_weight's A (dy along p) and for every B (w along (c, kh, kw), x along
// p). The next slice is read into registers while the block computes on this one.
//
// backward_weight's Kdim (N*OH*OW: 200704 for 64 channels of 28x28 at batch 256) dwarfs its M x Ncol
// (64 x 576: 9 tiles of 64x64). Such GEMMs, of few tiles and a long Kdim, are split along k (split-K):
// block z of the grid's third dimension sums its own contiguous range of k into its own slice of a
// workspace shaped like the output, and a second kernel adds the slices, in slice order, into the
// output. The number of slices depends on the shape alone (a few blocks per SM of a 132-SM H100), so
// every run and every device gives the same bits. Each output is otherwise one thread's (fp32) or one
// warp's (tf32) sum in a fixed order.
namespace implicit {

constexpr int kBlock = 256;  // 8 warps
constexpr int kSMs = 132;    // an H100: the split-K rule aims at a few blocks per SM

// A row or column of the block's tile, decomposed (see above); base < 0 marks one past the GEMM's edge.
struct Ctx {
  int base, h, w, out;
};
// A sum index k and its digits (hi, mid, lo) in the pass's radices (mid_radix, lo_radix).
struct KPos {
  int k, hi, mid, lo;
};
// k written in the radices once; a step of BK written likewise, then added with carries.
__device__ __forceinline__ KPos kpos(int k, int mid_radix, int lo_radix) {
  const int q = k / lo_radix;
  return {k, q / mid_radix, q % mid_radix, k - q * lo_radix};
}
__device__ __forceinline__ void advance(KPos& p, const KPos& step, int mid_radix, int lo_radix) {
  p.k += step.k;
  p.lo += step.lo;
  int carry = p.lo >= lo_radix;
  p.lo -= carry ? lo_radix : 0;
  p.mid += step.mid + carry;
  carry = p.mid >= mid_radix;
  p.mid -= carry ? mid_radix : 0;
  p.hi += step.hi + carry;
}

// The convolution's sizes as 32-bit ints (the launchers check they fit).
struct Geo {
  int N, C, H, W, OC, KH, KW, sh, sw, ph, pw, OH, OW;
};

// The address of x at image offset `base` (n*C*H*W), channel ci, row ih, column iw; null in the padding.
__device__ __forceinline__ const float* x_at(const Geo& g, const float* x, int base, int ci, int ih, int iw) {
  return unsigned(ih) < unsigned(g.H) && unsigned(iw) < unsigned(g.W) ? x + base + (ci * g.H + ih) * g.W + iw : nullptr;
}
// An element read through its address: 0 where there is none.
__device__ __forceinline__ float value_at(const float* p) { return p ? *p : 0.0f; }

// Each pass: its GEMM's sizes, the radices of its k, the row and column tables, where A(row, k) and
// B(k, col) are read (a_at, b_at: their addresses, null where the element is 0; a and b their values),
// and where C's (i, j) goes: out[row.out + col.out]. A launch may hold several GEMMs (classes():
// strided backward_data's parity classes, below); for_class(c) is class c's pass.
struct Forward {
  Geo g;
  const float* x;
  const float* w;
  static constexpr bool kAAlongRows = true;  // neighbouring rows p: neighbouring x
  __device__ int classes() const { return 1; }  // one GEMM (BackwardDataStrided: one per class)
  __device__ Forward for_class(int) const { return *this; }
  __device__ int rows() const { return g.N * g.OH * g.OW; }
  __device__ int cols() const { return g.OC; }
  __device__ int depth() const { return g.C * g.KH * g.KW; }
  __device__ int mid_radix() const { return g.KH; }  // k = (ci, kh, kw)
  __device__ int lo_radix() const { return g.KW; }
  __device__ Ctx row(int p) const {  // p = (n, oh, ow)
    const int P = g.OH * g.OW, n = p / P, pix = p - n * P, oh = pix / g.OW, ow = pix - oh * g.OW;
    return {n * g.C * g.H * g.W, oh * g.sh - g.ph, ow * g.sw - g.pw, n * g.OC * P + pix};
  }
  __device__ Ctx col(int oc) const { return {oc * depth(), 0, 0, oc * g.OH * g.OW}; }
  __device__ const float* a_at(const Ctx& r, const KPos& k) const { return x_at(g, x, r.base, k.hi, r.h + k.mid, r.w + k.lo); }
  __device__ const float* b_at(const KPos& k, const Ctx& c) const { return w + c.base + k.k; }
};

struct BackwardData {
  Geo g;
  const float* dy;
  const float* w;
  static constexpr bool kAAlongRows = true;  // neighbouring rows q: neighbouring dy
  __device__ int classes() const { return 1; }  // one GEMM (BackwardDataStrided: one per class)
  __device__ BackwardData for_class(int) const { return *this; }
  __device__ int rows() const { return g.N * g.H * g.W; }
  __device__ int cols() const { return g.C; }
  __device__ int depth() const { return g.OC * g.KH * g.KW; }
  __device__ int mid_radix() const { return g.KH; }  // k = (oc, kh, kw)
  __device__ int lo_radix() const { return g.KW; }
  __device__ Ctx row(int q) const {  // q = (n, ih, iw): h, w hold ih + ph, iw + pw
    const int HW = g.H * g.W, n = q / HW, pix = q - n * HW, ih = pix / g.W, iw = pix - ih * g.W;
    return {n * g.OC * g.OH * g.OW, ih + g.ph, iw + g.pw, n * g.C * HW + pix};
  }
  __device__ Ctx col(int ci) const { return {ci * g.KH * g.KW, 0, 0, ci * g.H * g.W}; }
  __device__ const float* a_at(const Ctx& r, const KPos& k) const {
    int oh = r.h - k.mid, ow = r.w - k.lo;  // = oh * sh, ow * sw
    if (oh < 0 || ow < 0) return nullptr;
    if (g.sh != 1) {
      if (oh % g.sh != 0) return nullptr;
      oh /= g.sh;
    }
    if (g.sw != 1) {
      if (ow % g.sw != 0) return nullptr;
      ow /= g.sw;
    }
    return oh < g.OH && ow < g.OW ? dy + r.base + (k.hi * g.OH + oh) * g.OW + ow : nullptr;
  }
  __device__ const float* b_at(const KPos& k, const Ctx& c) const {  // w[oc][ci][kh][kw], c.base = ci*KH*KW
    return w + k.hi * g.C * g.KH * g.KW + c.base + k.mid * g.KW + k.lo;
  }
};

// ---- backward_data with a stride above 1, without the zeros: the parity classes.
//
// BackwardData's A(q, k) is 0 wherever ih + ph - kh is no multiple of sh (or iw + pw - kw of sw): for
// stride 2 that is three quarters of the (input, tap) pairs, gathered and multiplied all the same.
// Which taps reach an input row depends only on ih mod sh, so group the input positions by
// (ih mod sh, iw mod sw): each group, a parity class, is a dense GEMM over its own taps.
//
// One axis (rows; columns likewise with W, KW, sw, pw). The class of first row `first` (< sh) holds
//   the input rows  ih = first + sh*i,   i < count = ceil((H - first) / sh)
// and row ih meets tap kh at output row oh = (ih + ph - kh) / sh when that divides. Here
// ih + ph - kh = first + ph - kh + sh*i, so sh divides it exactly when kh = first + ph (mod sh): the
// class' taps are
//   kh = tap0 + sh*t,   tap0 = (first + ph) % sh,   t < taps = ceil((KH - tap0) / sh)   (0 if tap0 >= KH)
// and input i meets tap t at output row
//   oh = (first + ph - tap0) / sh + i - t = shift + i - t        (skipped when outside 0 <= oh < OH).
//
// Worked example: 3x3, stride 2, pad 1, H = 5 (OH = 3). Row ih meets tap kh at oh = (ih + 1 - kh) / 2.
//   first 0: rows ih = 0, 2, 4 (count 3); tap0 = 1 % 2 = 1: taps kh = 1 (taps 1); shift = (0 + 1 - 1)/2 = 0:
//            ih = 2 (i = 1) meets kh = 1 (t = 0) at oh = 0 + 1 - 0 = 1   [check: (2 + 1 - 1) / 2 = 1]
//   first 1: rows ih = 1, 3 (count 2);    tap0 = 2 % 2 = 0: taps kh = 0, 2 (taps 2); shift = (1 + 1 - 0)/2 = 1:
//            ih = 3 (i = 1) meets kh = 2 (t = 1) at oh = 1 + 1 - 1 = 1   [check: (3 + 1 - 2) / 2 = 1]
// With the columns alike, the four classes (first row, first column) = (0,0), (0,1), (1,0), (1,1) have
// 1x1, 1x2, 2x1 and 2x2 taps: 9 taps in all, where BackwardData gathers 4 x 9 = 36 per 2x2 block of
// inputs. A 1x1 stride-2 unpadded conv: tap0 = first % 2, so only class (0,0) has a tap; the other three
// have none, and their GEMM (depth 0) writes zeros.
//
// Class c's GEMM: row q = (n, i, j) in radices (count_h, count_w), col ci, sum over k = (oc, t, u) in
// radices (taps_h, taps_w):
//   A(q, k) = dy[n][oc][shift_h + i - t][shift_w + j - u]         (0 outside dy: the edges only)
//   B(k, ci) = w[oc][ci][tap0_h + sh*t][tap0_w + sw*u]
//   C(q, ci) -> dx[n][ci][first_h + sh*i][first_w + sw*j]
// All classes run in one launch: block z of the grid is class z % classes (first_h = c / sw, first_w =
// c % sw) of split-K's slice z / classes. Every dx element belongs to exactly one class, so each slice of
// the split-K workspace is written whole and the usual sum finishes it.
struct ParityAxis {
  int first, count, tap0, taps, shift;
};
__host__ __device__ inline ParityAxis parity_axis(int size, int kernel, int stride, int pad, int first) {
  const int tap0 = (first + pad) % stride;
  const int count = (size - first + stride - 1) / stride;  // 0 where first >= size
  const int taps = kernel > tap0 ? (kernel - tap0 + stride - 1) / stride : 0;
  return {first, count, tap0, taps, (first + pad - tap0) / stride};
}

struct BackwardDataStrided {
  Geo g;
  const float* dy;
  const float* w;
  ParityAxis ah, aw;  // this block's class (for_class), its rows and columns
  static constexpr bool kAAlongRows = true;  // neighbouring rows q: neighbouring j, neighbouring dy
  __device__ int classes() const { return g.sh * g.sw; }
  __device__ BackwardDataStrided for_class(int c) const {
    BackwardDataStrided p = *this;
    p.ah = parity_axis(g.H, g.KH, g.sh, g.ph, c / g.sw);
    p.aw = parity_axis(g.W, g.KW, g.sw, g.pw, c % g.sw);
    return p;
  }
  __device__ int rows() const { return g.N * ah.count * aw.count; }
  __device__ int cols() const { return g.C; }
  __device__ int depth() const { return g.OC * ah.taps * aw.taps; }  // 0: a class without taps (zeros)
  __device__ int mid_radix() const { return ah.taps > 0 ? ah.taps : 1; }  // k = (oc, t, u); never 0
  __device__ int lo_radix() const { return aw.taps > 0 ? aw.taps : 1; }
  __device__ Ctx row(int q) const {  // q = (n, i, j): h, w hold shift_h + i, shift_w + j
    const int per_image = ah.count * aw.count, n = q / per_image, pix = q - n * per_image;
    const int i = pix / aw.count, j = pix - i * aw.count;
    const int ih = ah.first + g.sh * i, iw = aw.first + g.sw * j;
    return {n * g.OC * g.OH * g.OW, ah.shift + i, aw.shift + j, (n * g.C * g.H + ih) * g.W + iw};
  }
  __device__ Ctx col(int ci) const {  // base: w[0][ci][tap0_h][tap0_w]
    return {(ci * g.KH + ah.tap0) * g.KW + aw.tap0, 0, 0, ci * g.H * g.W};
  }
  __device__ const float* a_at(const Ctx& r, const KPos& k) const {  // k = (oc, t, u) = (hi, mid, lo)
    const int oh = r.h - k.mid, ow = r.w - k.lo;
    return unsigned(oh) < unsigned(g.OH) && unsigned(ow) < unsigned(g.OW) ? dy + r.base + (k.hi * g.OH + oh) * g.OW + ow
                                                                          : nullptr;
  }
  __device__ const float* b_at(const KPos& k, const Ctx& c) const {  // w[oc][ci][tap0_h + sh*t][tap0_w + sw*u]
    return w + k.hi * g.C * g.KH * g.KW + c.base + g.sh * k.mid * g.KW + g.sw * k.lo;
  }
};

struct BackwardWeight {
  Geo g;
  const float* x;
  const float* dy;
  static constexpr bool kAAlongRows = false;  // neighbouring k = (n, oh, ow): neighbouring dy
  __device__ int classes() const { return 1; }  // one GEMM (BackwardDataStrided: one per class)
  __device__ BackwardWeight for_class(int) const { return *this; }
  __device__ int rows() const { return g.OC; }
  __device__ int cols() const { return g.C * g.KH * g.KW; }
  __device__ int depth() const { return g.N * g.OH * g.OW; }
  __device__ int mid_radix() const { return g.OH; }  // k = (n, oh, ow)
  __device__ int lo_radix() const { return g.OW; }
  __device__ Ctx row(int oc) const { return {oc * g.OH * g.OW, 0, 0, oc * cols()}; }
  __device__ Ctx col(int j) const {  // j = (ci, kh, kw): h, w hold kh - ph, kw - pw
    const int KK = g.KH * g.KW, ci = j / KK, r = j - ci * KK, kh = r / g.KW, kw = r - kh * g.KW;
    return {ci, kh - g.ph, kw - g.pw, j};
  }
  __device__ const float* a_at(const Ctx& r, const KPos& k) const {
    return dy + k.hi * g.OC * g.OH * g.OW + r.base + k.mid * g.OW + k.lo;
  }
  __device__ const float* b_at(const KPos& k, const Ctx& c) const {
    return x_at(g, x, k.hi * g.C * g.H * g.W, c.base, k.mid * g.sh + c.h, k.lo * g.sw + c.w);
  }
};

// Which element of a slice (E x BK: E rows of A or columns of B) value v of this thread is.
//   along the rows (E % 32 == 0): lane -> row, warp -> k; the thread's k offsets are warp + 8 s,
//                                 s < BK / 8, each kept as a KPos
//   along k (32 % BK == 0):       lane % BK -> k, the rest -> row; one k offset per thread
template <int E, int BK, bool kAlongRows>
struct Slots {
  static constexpr int kCount = E * BK / kBlock;                 // values per thread
  static constexpr int kKs = kAlongRows ? BK / 8 : 1;            // k offsets per thread
  static constexpr int kRowsPer = kCount / kKs;                  // rows per k offset
  static_assert(kAlongRows ? E % 32 == 0 && BK % 8 == 0 : 32 % BK == 0, "whole warps per slice");
  __device__ static int row(int v) {
    const int t = threadIdx.x;
    return kAlongRows ? t % 32 + 32 * (v % kRowsPer) : t / BK + (kBlock / BK) * v;
  }
  __device__ static int ks(int v) { return kAlongRows ? v / kRowsPer : 0; }  // which k offset
  __device__ static int kk(int s) {                                           // offset s in the slice
    const int t = threadIdx.x;
    return kAlongRows ? t / 32 + 8 * s : t % BK;
  }
};

// A tile configuration: the pass, the block tile BM x BN x BK, and for tf32 the warps' layout.
template <class P, int BM_, int BN_, int BK_>
struct Tile {
  using Pass = P;
  static constexpr int BM = BM_, BN = BN_, BK = BK_;
  using SA = Slots<BM, BK, P::kAAlongRows>;
  using SB = Slots<BN, BK, false>;  // every pass's B is contiguous along k
  // The block's shared memory: one slice of each operand (k-major, rows padded by 4 floats: 32-byte
  // aligned fragments for wmma), and the row and column tables.
  struct alignas(128) Smem {
    float a[BK][BM + 4];  // a[k][m] = A(row0 + m, k0 + k)
    float b[BK][BN + 4];  // b[k][n] = B(k0 + k, col0 + n)
    Ctx rows[BM], cols[BN];
  };
};

// The mma core's tile (conv2d_implicit_mma_kernel): BM x BN of C, K in slices of 32, 8 warps as 2 down
// M x 4 along N, each a warp tile of (BM / 2) x (BN / 4) as m16n8k8 tiles; three slices in flight. A
// slice is stored k-major without padding, a[k][swizzled(k, m)] (below), then b[k][swizzled(k, n)]; the
// three take 96 KiB at 128x128 (72 KiB at 128x64): dynamic shared memory past the 48 KiB a block has
// without opting in (D2L_SET_MAX_DYNAMIC_SHARED). The tables are static.
template <class P, int BM_, int BN_>
struct MmaTile {
  using Pass = P;
  static constexpr int BM = BM_, BN = BN_, BK = 32, kStages = 3;
  using SA = Slots<BM, BK, P::kAAlongRows>;
  using SB = Slots<BN, BK, false>;
  static constexpr int kStageFloats = BK * (BM + BN);
  static constexpr size_t kDynamicBytes = size_t(kStages) * kStageFloats * sizeof(float);
  static_assert(BM % 32 == 0 && BN % 32 == 0, "whole swizzle groups");
  struct Smem {
    Ctx rows[BM], cols[BN];
  };
};
// Where column m of row k of a slice sits: m with its bits 3 and 4 flipped by k % 4. A fragment load
// reads rows k = t and t + 4 (t = lane % 4) at columns m0 + g (g = lane / 4, m0 a multiple of 8): the
// four rows' groups of 8 land in four different quarters of the 32 banks, so the warp's 32 reads are
// one pass (unswizzled, every row k starts at bank 0: four lanes a bank).
__device__ __forceinline__ int swizzled(int k, int m) { return m ^ ((k & 3) << 3); }

// The block's row and column tables (Ctx, above): its BM rows from blockIdx.y * BM, its BN columns from
// blockIdx.x * BN; base -1 past the GEMM's edge. Every core fills them first.
template <class T>
__device__ __forceinline__ void load_tables(const typename T::Pass& pass, typename T::Smem& s) {
  const int M = pass.rows(), N = pass.cols(), row0 = int(blockIdx.y) * T::BM, col0 = int(blockIdx.x) * T::BN;
  for (int m = int(threadIdx.x); m < T::BM; m += kBlock) s.rows[m] = row0 + m < M ? pass.row(row0 + m) : Ctx{-1, 0, 0, 0};
  for (int n = int(threadIdx.x); n < T::BN; n += kBlock) s.cols[n] = col0 + n < N ? pass.col(col0 + n) : Ctx{-1, 0, 0, 0};
}

// This thread's values of one operand's slice (Slots S): for each value v, its address through the
// pass's `at` (a_at for a row of A, b_at for a column of B), or nullptr where the element is 0: past
// the GEMM's edge (base -1 in the table) or past k_end (split-K's range). Every core loads through it.
template <class S, class At, class Use>
__device__ __forceinline__ void each_value(const Ctx* table, const KPos* ks, int k_end, At at, Use use) {
  D2L_CONV_UNROLL
  for (int v = 0; v < S::kCount; ++v) {
    const Ctx c = table[S::row(v)];
    const KPos& k = ks[S::ks(v)];
    use(v, c.base >= 0 && k.k < k_end ? at(c, k) : nullptr);
  }
}

// The loop both variants share: the tables, then per slice stash (registers -> shared memory, each
// value through `round`), compute, and meanwhile fetch (global memory -> registers) of the next slice.
// The block sums k in [split * k_chunk, min(K, (split + 1) * k_chunk)): split-K's range (empty for a
// class whose K ends before it: its slice of the output gets zeros).
template <class T, class Round, class Compute>
__device__ __forceinline__ void gemm_loop(const typename T::Pass& pass, typename T::Smem& s, int split, int k_chunk,
                                          Round round, Compute compute) {
  using SA = typename T::SA;
  using SB = typename T::SB;
  constexpr int BK = T::BK;
  const int K = pass.depth(), mr = pass.mid_radix(), lr = pass.lo_radix();
  load_tables<T>(pass, s);
  const int k_begin = split * k_chunk, k_end = K - k_begin < k_chunk ? K : k_begin + k_chunk;
  KPos ka[SA::kKs], kb[SB::kKs];  // this thread's k offsets in the slice, decomposed
  D2L_CONV_UNROLL
  for (int i = 0; i < SA::kKs; ++i) ka[i] = kpos(k_begin + SA::kk(i), mr, lr);
  D2L_CONV_UNROLL
  for (int i = 0; i < SB::kKs; ++i) kb[i] = kpos(k_begin + SB::kk(i), mr, lr);
  const KPos step = kpos(BK, mr, lr);  // BK in the same radices
  __syncthreads();                     // tables complete
  float ra[SA::kCount], rb[SB::kCount];
  auto a_at = [&](const Ctx& r, const KPos& k) { return pass.a_at(r, k); };
  auto b_at = [&](const Ctx& c, const KPos& k) { return pass.b_at(k, c); };
  auto fetch = [&] {
    each_value<SA>(s.rows, ka, k_end, a_at, [&](int v, const float* p) { ra[v] = p ? value_at(p) : 0.0f; });
    each_value<SB>(s.cols, kb, k_end, b_at, [&](int v, const float* p) { rb[v] = p ? value_at(p) : 0.0f; });
  };
  fetch();
  for (int k0 = k_begin; k0 < k_end; k0 += BK) {
    D2L_CONV_UNROLL
    for (int v = 0; v < SA::kCount; ++v) s.a[SA::kk(SA::ks(v))][SA::row(v)] = round(ra[v]);
    D2L_CONV_UNROLL
    for (int v = 0; v < SB::kCount; ++v) s.b[SB::kk(SB::ks(v))][SB::row(v)] = round(rb[v]);
    __syncthreads();  // slice complete
    if (k0 + BK < k_end) {  // the next slice on its way into registers while this one is computed on
      D2L_CONV_UNROLL
      for (int i = 0; i < SA::kKs; ++i) advance(ka[i], step, mr, lr);
      D2L_CONV_UNROLL
      for (int i = 0; i < SB::kKs; ++i) advance(kb[i], step, mr, lr);
      fetch();
    }
    compute(s);
    __syncthreads();  // slice consumed
  }
}

// Block z of the grid: class z % classes of the pass (one class but for strided backward_data), slice
// z / classes of split-K. True where the block has rows of its class to compute (a smaller class
// leaves the last row tiles of the grid, sized for the largest, empty: those blocks return at once).
template <class T>
struct BlockJob {
  typename T::Pass pass;
  int split;
  __device__ BlockJob(const typename T::Pass& launched)
      : pass(launched.for_class(int(blockIdx.z) % launched.classes())), split(int(blockIdx.z) / launched.classes()) {}
  __device__ bool has_rows() const { return int(blockIdx.y) * T::BM < pass.rows(); }
};

}  // namespace implicit

// fp32: grid (ceil(Ncol / BN), ceil(M / BM), slices), block 256 as 16 x 16; thread (tm, tn) = (t % 16,
// t / 16) owns rows tm + 16 i and columns tn + 16 j of the block tile (i < BM / 16, j < BN / 16): a
// warp's stores are 16 neighbouring rows (neighbouring y or dx). Output (i, j) goes to
// out[split * slice + row.out + col.out] (slice: the split-K workspace's stride, else 0).
template <class T>
__global__ void conv2d_implicit_gemm_kernel(typename T::Pass launched, float* out, int64_t slice, int k_chunk) {
  using namespace implicit;
  const BlockJob<T> job(launched);
  if (!job.has_rows()) return;
  using Smem = typename T::Smem;
  constexpr int BK = T::BK, TM = T::BM / 16, TN = T::BN / 16;
  D2L_SHARED(Smem, smem, [1]);
  Smem& s = smem[0];
  const int tm = threadIdx.x % 16, tn = threadIdx.x / 16;
  float acc[TM][TN] = {};
  gemm_loop<T>(job.pass, s, job.split, k_chunk, [](float v) { return v; }, [&](const Smem& sm) {
    D2L_CONV_UNROLL
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      D2L_CONV_UNROLL
      for (int i = 0; i < TM; ++i) a[i] = sm.a[k][tm + 16 * i];
      D2L_CONV_UNROLL
      for (int j = 0; j < TN; ++j) b[j] = sm.b[k][tn + 16 * j];
      D2L_CONV_UNROLL
      for (int i = 0; i < TM; ++i) {
        D2L_CONV_UNROLL
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
      }
    }
  });
  out += job.split * slice;
  D2L_CONV_UNROLL
  for (int i = 0; i < TM; ++i) {
    const Ctx r = s.rows[tm + 16 * i];
    if (r.base < 0) continue;
    D2L_CONV_UNROLL
    for (int j = 0; j < TN; ++j) {
      const Ctx c = s.cols[tn + 16 * j];
      if (c.base >= 0) out[r.out + c.out] = acc[i][j];
    }
  }
}

// tf32: the same grid and loads; warp w computes the (BM / 2) x (BN / 4) part at rows wm = (w / 4) *
// BM / 2, columns wn = (w % 4) * BN / 4 of the block tile, as FM x FN accumulator fragments of 16x16.
// Per 8-deep step of a slice it loads FM fragments of A (16 x 8, read column-major from a[k][m]) and FN
// of B (8 x 16, row-major from b[k][n]) and does FM * FN mma_sync. The epilogue: a fragment's layout
// across the lanes is CUDA's secret, so each fragment goes through the warp's own 16x16 of shared memory
// (column-major: lane e and e + 1 hold neighbouring rows), then lane e writes elements e, e + 32, ....
template <class T>
__global__ void conv2d_implicit_tf32_kernel(typename T::Pass launched, float* out, int64_t slice, int k_chunk) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 tensor cores: sm_80 and later
  using namespace implicit;
  const BlockJob<T> job(launched);
  if (!job.has_rows()) return;
  using Smem = typename T::Smem;
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, kWarpsN = 4;
  constexpr int WM = BM / 2, WN = BN / kWarpsN, FM = WM / 16, FN = WN / 16;
  static_assert(BK % 8 == 0 && FM >= 1 && FN >= 1 && WM % 16 == 0 && WN % 16 == 0, "whole fragments per warp");
  D2L_SHARED(Smem, smem, [1]);
  Smem& s = smem[0];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wm = warp / kWarpsN * WM, wn = warp % kWarpsN * WN;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc[FM][FN];
  D2L_CONV_UNROLL
  for (int i = 0; i < FM; ++i) {
    D2L_CONV_UNROLL
    for (int j = 0; j < FN; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
  }
  gemm_loop<T>(job.pass, s, job.split, k_chunk, [](float v) { return to_tf32(v); }, [&](const Smem& sm) {
    D2L_CONV_UNROLL
    for (int kk = 0; kk < BK; kk += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> a[FM];
      wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> b[FN];
      D2L_CONV_UNROLL
      for (int i = 0; i < FM; ++i) wmma::load_matrix_sync(a[i], &sm.a[kk][wm + 16 * i], BM + 4);
      D2L_CONV_UNROLL
      for (int j = 0; j < FN; ++j) wmma::load_matrix_sync(b[j], &sm.b[kk][wn + 16 * j], BN + 4);
      D2L_CONV_UNROLL
      for (int i = 0; i < FM; ++i) {
        D2L_CONV_UNROLL
        for (int j = 0; j < FN; ++j) wmma::mma_sync(acc[i][j], a[i], b[j], acc[i][j]);
      }
    }
  });
  // The slices are consumed (gemm_loop's last barrier): a[][] becomes the warps' staging tiles.
  float* stage = &s.a[0][0] + warp * 256;
  out += job.split * slice;
  D2L_CONV_UNROLL
  for (int i = 0; i < FM; ++i) {
    D2L_CONV_UNROLL
    for (int j = 0; j < FN; ++j) {
      wmma::store_matrix_sync(stage, acc[i][j], 16, wmma::mem_col_major);
      __syncwarp();
      for (int e = lane; e < 256; e += 32) {
        const Ctx r = s.rows[wm + 16 * i + e % 16], c = s.cols[wn + 16 * j + e / 16];
        if (r.base >= 0 && c.base >= 0) out[r.out + c.out] = stage[e];
      }
      __syncwarp();  // stage read before the next fragment overwrites it
    }
  }
#endif
}

// mma: the tensor cores through PTX (kernels/cuda/ptx.cuh), where tf32 above goes through wmma. The same
// grid, passes, tables and split-K; per block:
//   loads     each thread's elements of a slice go straight from global to shared memory with 4-byte
//             cp.async (the gathered operand has no contiguous runs to take 16 bytes at once); where an
//             element is 0 (padding, no whole output position, past an edge, past k_end) the copy's
//             source size is 0 and it writes a zero. No registers on the way, no thread waits.
//   pipeline  three slices in flight: slice s + 2 is copied while slice s is computed on;
//             cp.async.wait_group then one barrier a slice (wmma's core: two, every element staged).
//   fragments read from the swizzled slice as PTX's m16n8k8 layout wants them (kernels/emu/ptx.hpp:
//             a0..a3 = A(g, t), A(g + 8, t), A(g, t + 4), A(g + 8, t + 4); b0, b1 = B(t, g), B(t + 4, g)),
//             each rounded to TF32 (cvt.rna) as it is read: no bank conflicts, no padding.
//   epilogue  the accumulators straight from registers to the output through the tables: d[q] of a
//             tile is C(g + 8 (q / 2), 2 t + q % 2) of it; no staging in shared memory.
template <class T>
__launch_bounds__(implicit::kBlock, 2)  // two blocks an SM: at most 128 registers a thread
__global__ void conv2d_implicit_mma_kernel(typename T::Pass launched, float* out, int64_t slice, int k_chunk) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 tensor cores: sm_80 and later
  using namespace implicit;
  const BlockJob<T> job(launched);
  if (!job.has_rows()) return;
  using Smem = typename T::Smem;
  using SA = typename T::SA;
  using SB = typename T::SB;
  constexpr int BM = T::BM, BN = T::BN, BK = T::BK, kStages = T::kStages, kWarpsN = 4;
  constexpr int WM = BM / 2, WN = BN / kWarpsN, TM = WM / 16, TN = WN / 8;
  D2L_SHARED(Smem, smem, [1]);
  Smem& s = smem[0];
  D2L_DYNAMIC_SHARED(float, stages);  // kStages slices, each a[BK][BM] then b[BK][BN]
  auto a_of = [&](int sl) { return reinterpret_cast<float(*)[BM]>(stages + (sl % kStages) * T::kStageFloats); };
  auto b_of = [&](int sl) { return reinterpret_cast<float(*)[BN]>(stages + (sl % kStages) * T::kStageFloats + BK * BM); };
  const typename T::Pass& pass = job.pass;
  const int K = pass.depth(), mr = pass.mid_radix(), lr = pass.lo_radix();
  load_tables<T>(pass, s);
  const int k_begin = job.split * k_chunk, k_end = K - k_begin < k_chunk ? K : k_begin + k_chunk;
  const int slices = k_end > k_begin ? (k_end - k_begin + BK - 1) / BK : 0;
  KPos ka[SA::kKs], kb[SB::kKs];  // this thread's k offsets in the next slice to load, decomposed
  D2L_CONV_UNROLL
  for (int i = 0; i < SA::kKs; ++i) ka[i] = kpos(k_begin + SA::kk(i), mr, lr);
  D2L_CONV_UNROLL
  for (int i = 0; i < SB::kKs; ++i) kb[i] = kpos(k_begin + SB::kk(i), mr, lr);
  const KPos step = kpos(BK, mr, lr);
  __syncthreads();  // tables complete
  auto a_at = [&](const Ctx& r, const KPos& k) { return pass.a_at(r, k); };
  auto b_at = [&](const Ctx& c, const KPos& k) { return pass.b_at(k, c); };
  auto load = [&](int64_t sl) {  // slice sl into stage sl % kStages as one cp.async group (empty past the last)
    if (sl < slices) {
      float(*a)[BM] = a_of(sl);
      float(*b)[BN] = b_of(sl);
      // A zero element is a copy of 0 source bytes (it writes a zero; `out` is a valid address).
      each_value<SA>(s.rows, ka, k_end, a_at, [&](int v, const float* p) {
        const int kk = SA::kk(SA::ks(v));
        ptx::cp_async4(&a[kk][swizzled(kk, SA::row(v))], p ? p : out, p != nullptr);
      });
      each_value<SB>(s.cols, kb, k_end, b_at, [&](int v, const float* p) {
        const int kk = SB::kk(SB::ks(v));
        ptx::cp_async4(&b[kk][swizzled(kk, SB::row(v))], p ? p : out, p != nullptr);
      });
      D2L_CONV_UNROLL
      for (int i = 0; i < SA::kKs; ++i) advance(ka[i], step, mr, lr);
      D2L_CONV_UNROLL
      for (int i = 0; i < SB::kKs; ++i) advance(kb[i], step, mr, lr);
    }
    ptx::cp_async_commit();
  };
  auto tf32_bits = [](float v) {
    v = to_tf32(v);
    uint32_t bits;
    memcpy(&bits, &v, 4);
    return bits;
  };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int wm = warp / kWarpsN * WM, wn = warp % kWarpsN * WN;
  float acc[TM][TN][4] = {};
  // Slice sl + 2 copied while slice sl is computed on; kStages - 2 groups pending: slice sl's have landed.
  cp_async_pipeline<kStages, kStages - 2>(slices, load, [&](int64_t sl) {
    const float(*a)[BM] = a_of(sl);
    const float(*b)[BN] = b_of(sl);
    D2L_CONV_UNROLL
    for (int k0 = 0; k0 < BK; k0 += 8) {
      const int k1 = k0 + t, k2 = k1 + 4;
      uint32_t fa[TM][4], fb[TN][2];
      D2L_CONV_UNROLL
      for (int i = 0; i < TM; ++i) {
        const int m = wm + 16 * i + g;
        fa[i][0] = tf32_bits(a[k1][swizzled(k1, m)]), fa[i][1] = tf32_bits(a[k1][swizzled(k1, m + 8)]);
        fa[i][2] = tf32_bits(a[k2][swizzled(k2, m)]), fa[i][3] = tf32_bits(a[k2][swizzled(k2, m + 8)]);
      }
      D2L_CONV_UNROLL
      for (int j = 0; j < TN; ++j) {
        const int n = wn + 8 * j + g;
        fb[j][0] = tf32_bits(b[k1][swizzled(k1, n)]), fb[j][1] = tf32_bits(b[k2][swizzled(k2, n)]);
      }
      D2L_CONV_UNROLL
      for (int i = 0; i < TM; ++i) {
        D2L_CONV_UNROLL
        for (int j = 0; j < TN; ++j) ptx::mma_tf32_m16n8k8(acc[i][j], fa[i], fb[j]);
      }
    }
  });
  out += job.split * slice;
  D2L_CONV_UNROLL
  for (int i = 0; i < TM; ++i) {
    D2L_CONV_UNROLL
    for (int j = 0; j < TN; ++j) {
      for (int q = 0; q < 4; ++q) {
        const Ctx r = s.rows[wm + 16 * i + g + 8 * (q / 2)], c = s.cols[wn + 8 * j + 2 * t + q % 2];
        if (r.base >= 0 && c.base >= 0) out[r.out + c.out] = acc[i][j][q];
      }
    }
  }
#endif
}

// Split-K's second step: out[i] = the sum of the slices' ws[z * n + i], z = 0, 1, ... in order.
__global__ void conv2d_implicit_splitk_sum_kernel(const float* __restrict__ ws, int64_t slices, int64_t n,
                                                  float* __restrict__ out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    float acc = 0.0f;
    for (int64_t z = 0; z < slices; ++z) acc += ws[z * n + i];
    out[i] = acc;
  }
}

namespace {

// The sizes as ints, or a one-line error: kernel5 indexes with 32-bit ints.
implicit::Geo geo(const Conv2dShape& s) {
  const int64_t OH = s.OH(), OW = s.OW(), limit = int64_t{1} << 31;
  const int64_t sizes[] = {s.N * s.C * s.H * s.W, s.N * s.OC * OH * OW, s.OC * s.C * s.KH * s.KW};
  for (int64_t n : sizes)
    if (n >= limit) throw std::invalid_argument("conv2d implicit GEMM: a tensor of 2^31 or more elements (kernel5 indexes with 32-bit ints)");
  auto i = [](int64_t v) { return static_cast<int>(v); };
  return {i(s.N), i(s.C), i(s.H), i(s.W), i(s.OC), i(s.KH), i(s.KW), i(s.stride_h), i(s.stride_w), i(s.pad_h), i(s.pad_w), i(OH), i(OW)};
}

enum class Core { fp32, wmma, mma };

template <class T>
void launch_tile(Stream stream, Core core, const typename T::Pass& pass, float* out, int64_t slice, int64_t M,
                 int64_t N, int64_t splits, int64_t classes, int k_chunk) {
  const int64_t gx = (N + T::BN - 1) / T::BN, gy = (M + T::BM - 1) / T::BM;
  if (gy > 65535 || splits * classes > 65535)
    throw std::invalid_argument("conv2d implicit GEMM: the shape is too large for one grid");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy), static_cast<unsigned>(splits * classes));
  const dim3 block(implicit::kBlock);
  if constexpr (requires { T::kStages; }) {  // an MmaTile: the mma core's
    D2L_SET_MAX_DYNAMIC_SHARED(conv2d_implicit_mma_kernel<T>, T::kDynamicBytes);
    D2L_LAUNCH(conv2d_implicit_mma_kernel<T>, grid, block, T::kDynamicBytes, stream)(pass, out, slice, k_chunk);
    D2L_CHECK_LAUNCH(conv2d_implicit_mma_kernel);
  } else if (core == Core::wmma) {
    D2L_LAUNCH(conv2d_implicit_tf32_kernel<T>, grid, block, 0, stream)(pass, out, slice, k_chunk);
    D2L_CHECK_LAUNCH(conv2d_implicit_tf32_kernel);
  } else {
    D2L_LAUNCH(conv2d_implicit_gemm_kernel<T>, grid, block, 0, stream)(pass, out, slice, k_chunk);
    D2L_CHECK_LAUNCH(conv2d_implicit_gemm_kernel);
  }
}

std::atomic<int> g_implicit_tile{0};
std::atomic<ImplicitCore> g_implicit_core{ImplicitCore::wmma};

// One pass's GEMM (rows M, columns N, depth K; `out` holds out_size floats). The tiles (unless
// set_conv2d_implicit_tile says): tf32 always 64x64, fp32 128x128 where that still gives two blocks per SM,
// else 64x64. On an H200 the ResNet-18 step's convs took 35.3 ms in tf32 with 64x64 tiles everywhere, 39.4 ms
// with 128x128 everywhere and 40.1 ms with fp32's rule (bench/results/gpu-2026-11-27-H200-2.md): Nsight Compute
// shows the tf32 kernel bound by shared memory (L1) traffic and latency at a quarter occupancy, which the
// smaller tile's 4x more blocks hide better. Split-K where the tiles are fewer than half the
// blocks aimed at (4 per SM): as many slices as bring them there, each at least 4 slices of k deep,
// the workspace at most 2^26 floats. A pass of several classes (strided backward_data) gives its largest
// class' M and K; its blocks are `classes` times as many. The mma core (set_conv2d_implicit_core) tiles
// 128x128, or 128x64 where N <= 64 (a tile setting of 128 or 64 forces one), in 32-deep slices.
template <class P>
void launch_implicit(Stream stream, const P& pass, float* out, int64_t M, int64_t N, int64_t K, int64_t out_size,
                     int64_t classes = 1) {
  using namespace implicit;
  if (M <= 0 || N <= 0) return;
  if (M >= (int64_t{1} << 31) || N >= (int64_t{1} << 31) || K >= (int64_t{1} << 31))
    throw std::invalid_argument("conv2d implicit GEMM: a GEMM size of 2^31 or more (kernel5 indexes with 32-bit ints)");
  const bool tf32 = uses_tf32();
  const Core core = !tf32 ? Core::fp32 : conv2d_implicit_core() == ImplicitCore::mma ? Core::mma : Core::wmma;
  const int64_t BK = core == Core::fp32 ? 16 : 32, target = 4 * kSMs;
  const int forced = conv2d_implicit_tile();
  const bool big = forced ? forced == 128
                 : core == Core::mma ? N > 64
                 : !tf32 && classes * ((M + 127) / 128) * ((N + 127) / 128) >= 2 * kSMs;
  const int64_t tm = core == Core::mma || big ? 128 : 64, tn = big ? 128 : 64;
  const int64_t tiles = classes * ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
  int64_t splits = 1;
  if (tiles < target / 2)
    splits = std::max<int64_t>(1, std::min({target / tiles, (K + 4 * BK - 1) / (4 * BK), (int64_t{1} << 26) / out_size}));
  const int64_t k_chunk = ((K + splits - 1) / splits + BK - 1) / BK * BK;  // whole slices
  splits = (K + k_chunk - 1) / k_chunk;
  ScratchBuffer<float> ws(stream, splits > 1 ? splits * out_size : 0);
  float* target_out = splits > 1 ? ws.data() : out;
  const int64_t slice = splits > 1 ? out_size : 0;
  const int kc = static_cast<int>(k_chunk);
  if (core == Core::mma && big) launch_tile<MmaTile<P, 128, 128>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  else if (core == Core::mma) launch_tile<MmaTile<P, 128, 64>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  else if (tf32 && big) launch_tile<Tile<P, 128, 128, 32>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  else if (tf32) launch_tile<Tile<P, 64, 64, 32>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  else if (big) launch_tile<Tile<P, 128, 128, 16>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  else launch_tile<Tile<P, 64, 64, 16>>(stream, core, pass, target_out, slice, M, N, splits, classes, kc);
  if (splits > 1) D2L_LAUNCH_OVER(out_size, stream, conv2d_implicit_splitk_sum_kernel, ws.data(), splits, out_size, out);
}
}  // namespace

void set_conv2d_implicit_tile(int tile) { g_implicit_tile = tile == 64 || tile == 128 ? tile : 0; }
int conv2d_implicit_tile() { return g_implicit_tile.load(std::memory_order_relaxed); }
void set_conv2d_implicit_core(ImplicitCore core) { g_implicit_core = core; }
ImplicitCore conv2d_implicit_core() { return g_implicit_core.load(std::memory_order_relaxed); }

void conv2d_forward_implicit(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  const int64_t OH = s.OH(), OW = s.OW(), n = s.N * s.OC * OH * OW;
  if (s.C * s.KH * s.KW == 0) return fill(stream, y, n, 0.0f);
  launch_implicit(stream, implicit::Forward{geo(s), x, w}, y, s.N * OH * OW, s.OC, s.C * s.KH * s.KW, n);
}

// A stride above 1: the parity classes (BackwardDataStrided), all in one launch; stride 1: one GEMM.
void conv2d_backward_data_implicit(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t n = s.N * s.C * s.H * s.W;
  if (s.OC == 0) return fill(stream, dx, n, 0.0f);
  const implicit::Geo g = geo(s);
  if (g.sh == 1 && g.sw == 1)
    return launch_implicit(stream, implicit::BackwardData{g, dy, w}, dx, s.N * s.H * s.W, s.C, s.OC * s.KH * s.KW, n);
  // The largest class: first row and column 0 has the most positions, ceil(KH / sh) x ceil(KW / sw) the
  // most taps (any class whose tap0 is 0).
  const implicit::ParityAxis rows = implicit::parity_axis(g.H, g.KH, g.sh, 0, 0);
  const implicit::ParityAxis cols = implicit::parity_axis(g.W, g.KW, g.sw, 0, 0);
  const implicit::BackwardDataStrided pass{g, dy, w, {}, {}};
  launch_implicit(stream, pass, dx, s.N * rows.count * cols.count, s.C, s.OC * rows.taps * cols.taps, n, g.sh * g.sw);
}

void conv2d_backward_weight_implicit(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t n = s.OC * s.C * s.KH * s.KW;
  if (s.N == 0) return fill(stream, dw, n, 0.0f);  // no images: the gradient is zero
  launch_implicit(stream, implicit::BackwardWeight{geo(s), x, dy}, dw, s.OC, s.C * s.KH * s.KW, s.N * s.OH() * s.OW(), n);
}

}  // namespace D2L_CUDA_NS
