// gemm16 for bfloat16 on AVX512-BF16's dot-product instruction, VDPBF16PS: in each of 16 float32
// lanes it multiplies a pair of bfloat16 values by another pair and adds both products to the lane,
// twice kernel3's (gemm_packed.cpp) multiply-adds per instruction, on operands half as wide.
//
// The loops are kernel3's, over pairs of k: the packed slivers hold 32-bit words, each two bfloat16
// values of consecutive k (k even in the low half), so that one broadcast of A's word and one load of
// B's 16 words feed the instruction:
//
//     for pc in steps of KC:                 pack Bp[kp][j] = (op(B)(2kp, j), op(B)(2kp+1, j))
//       for ic in steps of MC:               pack Ap[kp][r] = (op(A)(r, 2kp), op(A)(r, 2kp+1))
//         for each 8 x 48 tile of C:         24 accumulators of 16 floats
//           for kp in 0..kc/2:               3 loads of B, 8 broadcasts of A, 24 VDPBF16PS
//
// An odd K pads its last pair with zeros in both operands (0 * 0 adds nothing).
//
// The instruction's arithmetic is its own (Intel's manual, which this project's CPUs follow bit for
// bit: tests/test_gemm16.cpp): the high pair's product is added first, then the low pair's, each
// rounded to nearest even; subnormal inputs (the accumulator's too) count as zero and subnormal
// results become zero. So its sums differ from kernel1's by float32's summation bound, as kernel3's
// do, except where a value is subnormal. dpbf16_lane writes that arithmetic out for one lane: the
// member runs it in place of the instruction (`hw` false) on CPUs without it, and the tests compare
// the two. Each value of C is the same sequence of operations whoever computes it: C does not depend
// on the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

namespace d2l::kernels::cpu {

namespace {

constexpr int64_t kMR = 8, kNR = 48;             // the tile of C: 8 rows, 3 vectors of 16 floats
constexpr int64_t kKC = 384, kMC = 160, kNC = 3072;  // k (even), rows, columns of a block
static_assert(kKC % 2 == 0 && kMC % kMR == 0 && kNC % kNR == 0);

float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float bf16_low(uint32_t pair) { return float_from_bf16(static_cast<uint16_t>(pair)); }
float bf16_high(uint32_t pair) { return float_from_bf16(static_cast<uint16_t>(pair >> 16)); }

// op(X)(i, k) of a row-major 16-bit matrix, 0 outside its rows x cols.
struct Operand16 {
  const uint16_t* p;
  bool trans;
  int64_t ld, rows, cols;
  uint32_t at(int64_t i, int64_t k) const {
    if (i >= rows || k >= cols) return 0;
    return trans ? p[k * ld + i] : p[i * ld + k];
  }
};

// The word of op(X)(i, k) and op(X)(i, k + 1) where X's rows run along k (not transposed), both inside X:
// one 32-bit load (k in the low half on a little-endian CPU).
[[gnu::always_inline]] inline uint32_t pair_at(const Operand16& X, int64_t i, int64_t k) {
  uint32_t w;
  std::memcpy(&w, X.p + i * X.ld + k, sizeof w);
  return w;
}

// A sliver of `width` rows i0.. of op(X) over k [p0, p0 + kc): out[kp][r], zeros past X's edges. Whole
// pairs of a whole sliver are read a word at a time (pair_at), or, from a stored transpose, two rows
// that run along the sliver, interleaved (a loop GCC vectorises); the rest element by element.
template <int64_t width>
void pack_sliver(const Operand16& X, int64_t i0, int64_t n, int64_t p0, int64_t kc, uint32_t* out) {
  const int64_t pairs = (kc + 1) / 2, whole = n == width ? kc / 2 : 0;
  if (X.trans)
    for (int64_t kp = 0; kp < whole; ++kp) {
      const uint16_t* lo = X.p + (p0 + 2 * kp) * X.ld + i0;
      const uint16_t* hi = lo + X.ld;
      for (int64_t r = 0; r < width; ++r) out[kp * width + r] = lo[r] | uint32_t{hi[r]} << 16;
    }
  else
    for (int64_t r = 0; r < width; ++r)
      for (int64_t kp = 0; kp < whole; ++kp) out[kp * width + r] = pair_at(X, i0 + r, p0 + 2 * kp);
  for (int64_t kp = whole; kp < pairs; ++kp)
    for (int64_t r = 0; r < width; ++r) {
      const int64_t i = r < n ? i0 + r : X.rows, k = p0 + 2 * kp;
      out[kp * width + r] = X.at(i, k) | (2 * kp + 1 < kc ? X.at(i, k + 1) << 16 : 0u);
    }
}

// Ap: rows [i0, i0 + mc) x k [p0, p0 + kc) of op(A), slivers of kMR rows: ap[s][kp][r].
void pack_a(const Operand16& A, int64_t i0, int64_t mc, int64_t p0, int64_t kc, uint32_t* ap) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t s = 0; s * kMR < mc; ++s)
    pack_sliver<kMR>(A, i0 + s * kMR, std::min(kMR, mc - s * kMR), p0, kc, ap + s * pairs * kMR);
}

// Bp: k [p0, p0 + kc) x columns [j0, j0 + nc) of op(B), slivers of kNR columns: bp[s][kp][j]
// (op(B)(k, j) is B^T's (j, k)).
void pack_b(const Operand16& Bt, int64_t p0, int64_t kc, int64_t j0, int64_t nc, uint32_t* bp) {
  const int64_t pairs = (kc + 1) / 2;
  for (int64_t s = 0; s * kNR < nc; ++s)
    pack_sliver<kNR>(Bt, j0 + s * kNR, std::min(kNR, nc - s * kNR), p0, kc, bp + s * pairs * kNR);
}

// C's tile (rows x cols of it inside C) = alpha * acc + b * C (b == 0: C not read).
void store_tile(const float* acc, float alpha, float b, float* C, int64_t ldc, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) C[r * ldc + j] = alpha * acc[r * kNR + j] + (b == 0.0f ? 0.0f : b * C[r * ldc + j]);
}

// A tile of C from its sums over `pairs` pairs: the instruction, or its arithmetic lane by lane.
#if defined(__x86_64__) && defined(__GNUC__)
[[gnu::target("avx512bf16,avx512f")]] void tile_dpbf16(int64_t pairs, const uint32_t* ap, const uint32_t* bp,
                                                        float alpha, float b, float* C, int64_t ldc, int64_t rows,
                                                        int64_t cols) {
  __m512 c[kMR][3];
  for (auto& row : c)
    for (auto& v : row) v = _mm512_setzero_ps();
#pragma GCC unroll 2
  for (int64_t kp = 0; kp < pairs; ++kp) {
    __m512bh bv[3];
    for (int v = 0; v < 3; ++v) bv[v] = (__m512bh)_mm512_loadu_si512(bp + kp * kNR + v * 16);
#pragma GCC unroll 8
    for (int r = 0; r < kMR; ++r) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(static_cast<int>(ap[kp * kMR + r]));
      for (int v = 0; v < 3; ++v) c[r][v] = _mm512_dpbf16_ps(c[r][v], a, bv[v]);
    }
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(b);
  if (rows == kMR && cols == kNR) {  // a whole tile: vector stores
    for (int r = 0; r < kMR; ++r)
      for (int v = 0; v < 3; ++v) {
        float* out = C + r * ldc + v * 16;
        const __m512 x = _mm512_mul_ps(va, c[r][v]);
        _mm512_storeu_ps(out, b == 0.0f ? x : _mm512_add_ps(x, _mm512_mul_ps(vb, _mm512_loadu_ps(out))));
      }
    return;
  }
  float acc[kMR * kNR];
  for (int r = 0; r < kMR; ++r)
    for (int v = 0; v < 3; ++v) _mm512_storeu_ps(acc + r * kNR + v * 16, c[r][v]);
  store_tile(acc, alpha, b, C, ldc, rows, cols);
}
#endif

void tile_lanes(int64_t pairs, const uint32_t* ap, const uint32_t* bp, float alpha, float b, float* C, int64_t ldc,
                int64_t rows, int64_t cols) {
  float acc[kMR * kNR] = {};
  for (int64_t kp = 0; kp < pairs; ++kp)
    for (int64_t r = 0; r < kMR; ++r)
      for (int64_t j = 0; j < kNR; ++j) acc[r * kNR + j] = dpbf16_lane(acc[r * kNR + j], ap[kp * kMR + r], bp[kp * kNR + j]);
  store_tile(acc, alpha, b, C, ldc, rows, cols);
}

// C (M, N), its rows ldc floats apart, on one thread.
void five_loops(const Ctx& c, bool hw, const Operand16& A, const Operand16& Bt, int64_t M, int64_t N, int64_t K,
                float alpha, float beta, float* C, int64_t ldc) {
  const int64_t nc_max = std::min(kNC, (N + kNR - 1) / kNR * kNR), mc_max = std::min(kMC, (M + kMR - 1) / kMR * kMR);
  const int64_t pairs_max = (std::min(kKC, K) + 1) / 2;
  Scratch<uint32_t> bp(c.workspace, nc_max * pairs_max), ap(c.workspace, mc_max * pairs_max);
  for (int64_t jc = 0; jc < N; jc += kNC) {
    const int64_t nc = std::min(kNC, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKC) {
      const int64_t kc = std::min(kKC, K - pc), pairs = (kc + 1) / 2;
      const float b = pc == 0 ? beta : 1.0f;
      pack_b(Bt, pc, kc, jc, nc, bp.data());
      for (int64_t ic = 0; ic < M; ic += kMC) {
        const int64_t mc = std::min(kMC, M - ic);
        pack_a(A, ic, mc, pc, kc, ap.data());
        for (int64_t jr = 0; jr < nc; jr += kNR)
          for (int64_t ir = 0; ir < mc; ir += kMR) {
            const uint32_t* as = ap.data() + ir * pairs;
            const uint32_t* bs = bp.data() + jr * pairs;
            float* Ct = C + (ic + ir) * ldc + jc + jr;
            const int64_t rows = std::min(kMR, mc - ir), cols = std::min(kNR, nc - jr);
#if defined(__x86_64__) && defined(__GNUC__)
            if (hw) tile_dpbf16(pairs, as, bs, alpha, b, Ct, ldc, rows, cols);
            else
#endif
              tile_lanes(pairs, as, bs, alpha, b, Ct, ldc, rows, cols);
          }
      }
    }
  }
}

}  // namespace

float dpbf16_lane(float acc, uint32_t a, uint32_t b) {
  acc = daz(std::fma(daz(bf16_high(a)), daz(bf16_high(b)), daz(acc)));
  return daz(std::fma(daz(bf16_low(a)), daz(bf16_low(b)), acc));
}

bool has_avx512_bf16() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f");
  }();
  return has;
#else
  return false;
#endif
}

void gemm16_dpbf16(const Ctx& c, bool hw, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return gemm_scale(c, M * N, beta, C);
  hw = hw && has_avx512_bf16();
  // B read as B^T's rows: op(B)(k, j) = Bt(j, k).
  const Operand16 a{A, ta, ta ? M : K, M, K}, bt{B, !tb, tb ? K : N, N, K};
  // Threads take blocks of whole tiles: of rows when C has at least as many row tiles, else of columns.
  const int64_t row_tiles = (M + kMR - 1) / kMR, col_tiles = (N + kNR - 1) / kNR;
  const bool by_rows = row_tiles >= col_tiles;
  c.parallel_for(by_rows ? row_tiles : col_tiles, [&](int64_t b, int64_t e) {
    if (by_rows) {
      const int64_t r0 = b * kMR, r1 = std::min(M, e * kMR);
      Operand16 ab = a;
      ab.p = ta ? A + r0 : A + r0 * a.ld, ab.rows = r1 - r0;
      five_loops(c, hw, ab, bt, r1 - r0, N, K, alpha, beta, C + r0 * N, N);
    } else {
      const int64_t c0 = b * kNR, c1 = std::min(N, e * kNR);
      Operand16 bb = bt;
      bb.p = tb ? B + c0 * bt.ld : B + c0, bb.rows = c1 - c0;
      five_loops(c, hw, a, bb, M, c1 - c0, K, alpha, beta, C + c0, N);
    }
  });
}

}  // namespace d2l::kernels::cpu
