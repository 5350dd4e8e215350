// GEMM kernel3's loops for one vector width (gemm_packed.cpp says what they compute).
// No include guard: gemm_packed.cpp includes this file once per ISA, inside a namespace that sets
//   VW  floats per vector register     NV  vectors per row of the micro-tile (NR = VW * NV columns)
//   MR  rows of the micro-tile (MR * NV accumulators)
// and inside that ISA's `#pragma GCC target` region, so GCC's vector types below become its registers
// and its FMA instructions (the file is built with -ffp-contract=fast).

using Vec = float __attribute__((vector_size(VW * sizeof(float))));
using IVec = int32_t __attribute__((vector_size(VW * sizeof(int32_t))));
constexpr int NR = VW * NV;

// ---- packing: the panels the micro-kernel reads, contiguous, in the order it reads them.

[[gnu::always_inline]] inline Vec load(const float* p) {
  Vec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// Ap: rows [i0, i0 + mc) x columns [p0, p0 + kc) of op(A), cut into slivers of MR rows; sliver s
// holds ap[s][k][r] = op(A)(i0 + s*MR + r, p0 + k), 0 past row M. The micro-kernel then reads MR
// consecutive floats per k, whatever A's layout. A transposed A (stored (K, M)) has them consecutive
// already; a plain one is read row by row and written MR floats apart.
void pack_a(const Operand& A, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* ap);

// The transpose of a VW x VW block in registers (src rows ld floats apart -> dst rows ldd apart), in
// log2(VW) rounds: round m swaps, between rows i and i + m, the m x m sub-blocks off the diagonal.
// Each row pair is one two-source shuffle each way (vpermt2ps on AVX-512).
template <int m, bool low, int... l>
constexpr IVec swap_mask(std::integer_sequence<int, l...>) {  // lanes VW.. are the second source's
  return IVec{(low ? ((l & m) ? VW + l - m : l) : ((l & m) ? VW + l : l + m))...};
}
template <int m>
[[gnu::always_inline]] inline void transpose_round(Vec* r) {
  constexpr IVec lo = swap_mask<m, true>(std::make_integer_sequence<int, VW>());
  constexpr IVec hi = swap_mask<m, false>(std::make_integer_sequence<int, VW>());
#pragma GCC unroll 16
  for (int i = 0; i < VW; ++i)
    if ((i & m) == 0) {
      const Vec x = r[i], y = r[i + m];
      r[i] = __builtin_shuffle(x, y, lo);
      r[i + m] = __builtin_shuffle(x, y, hi);
    }
}
[[gnu::always_inline]] inline void transpose_block(const float* src, int64_t ld, float* dst, int64_t ldd) {
  Vec r[VW];
#pragma GCC unroll 16
  for (int i = 0; i < VW; ++i) r[i] = load(src + i * ld);
  if constexpr (VW >= 16) transpose_round<8>(r);
  if constexpr (VW >= 8) transpose_round<4>(r);
  transpose_round<2>(r);
  transpose_round<1>(r);
#pragma GCC unroll 16
  for (int i = 0; i < VW; ++i) std::memcpy(dst + i * ldd, &r[i], sizeof(Vec));
}

void pack_a(const Operand& A, int64_t i0, int64_t mc, int64_t p0, int64_t kc, float* ap) {
  int64_t s = 0;
  if constexpr (VW % MR == 0)  // a plain A, VW rows (VW / MR slivers) at a time: VW x VW blocks transposed
    for (; !A.trans && (s + VW / MR) * MR <= mc; s += VW / MR) {
      const float* src = A.p + (i0 + s * MR) * A.ld + p0;
      int64_t k = 0;
      for (; k + VW <= kc; k += VW) {
        float t[VW][VW];  // t[k'][r] = A(row s*MR + r, column k + k')
        transpose_block(src + k, A.ld, &t[0][0], VW);
        for (int64_t q = 0; q < VW / MR; ++q)
          for (int64_t kk = 0; kk < VW; ++kk) std::memcpy(ap + (s + q) * MR * kc + (k + kk) * MR, &t[kk][q * MR], MR * sizeof(float));
      }
      for (; k < kc; ++k)
        for (int64_t r = 0; r < VW; ++r) ap[(s + r / MR) * MR * kc + k * MR + r % MR] = src[r * A.ld + k];
    }
  for (; s * MR < mc; ++s) {
    const int64_t rows = std::min<int64_t>(MR, mc - s * MR), r0 = i0 + s * MR;
    float* out = ap + s * MR * kc;
    if (A.trans)
      for (int64_t k = 0; k < kc; ++k) std::memcpy(out + k * MR, A.p + (p0 + k) * A.ld + r0, rows * sizeof(float));
    else
      for (int64_t r = 0; r < rows; ++r) {
        const float* row = A.p + (r0 + r) * A.ld + p0;
        for (int64_t k = 0; k < kc; ++k) out[k * MR + r] = row[k];
      }
    for (int64_t k = 0; rows < MR && k < kc; ++k) std::fill(out + k * MR + rows, out + (k + 1) * MR, 0.0f);
  }
}

// Bp: rows [p0, p0 + kc) x columns [j0, j0 + nc) of op(B), cut into slivers of NR columns; sliver s
// holds bp[s][k][j] = op(B)(p0 + k, j0 + s*NR + j), 0 past column N: NR floats per k, NV vector loads.
// A plain B gives them as a piece of a row; a transposed B (stored (N, K), as the backward passes'
// are) has them down a column, so its slivers are transposed VW x VW blocks at a time.
void pack_b(const Operand& B, int64_t p0, int64_t kc, int64_t j0, int64_t nc, int64_t s, float* bp) {
  const int64_t cols = std::min<int64_t>(NR, nc - s * NR), c0 = j0 + s * NR;
  float* out = bp + s * NR * kc;
  if (!B.trans) {
    for (int64_t k = 0; k < kc; ++k) std::memcpy(out + k * NR, B.p + (p0 + k) * B.ld + c0, cols * sizeof(float));
  } else {
    int64_t jb = 0;
    for (; jb + VW <= cols; jb += VW) {  // VW columns: whole blocks of VW k, then the rest one by one
      const float* src = B.p + (c0 + jb) * B.ld + p0;
      int64_t k = 0;
      for (; k + VW <= kc; k += VW) transpose_block(src + k, B.ld, out + k * NR + jb, NR);
      for (; k < kc; ++k)
        for (int64_t j = 0; j < VW; ++j) out[k * NR + jb + j] = src[j * B.ld + k];
    }
    for (int64_t j = jb; j < cols; ++j)  // the last columns, at C's edge
      for (int64_t k = 0; k < kc; ++k) out[k * NR + j] = B.p[(c0 + j) * B.ld + p0 + k];
  }
  for (int64_t k = 0; cols < NR && k < kc; ++k) std::fill(out + k * NR + cols, out + (k + 1) * NR, 0.0f);
}

// ---- the micro-kernel: an MR x NR tile of C, held in MR * NV vector registers for the whole panel:
//
//     for k in 0..kc:                       one column of the A sliver, one row of the B sliver
//       b[0..NV) = bp[k][0..NR)             NV vector loads
//       for r in 0..MR:  acc[r][..] += ap[k][r] * b[..]      one broadcast, NV FMAs
//
// Each value of A loaded serves NR columns and each of B serves MR rows. Then C's tile, rows x cols of
// it (fewer at C's edges), takes alpha * acc + beta * C (beta == 0: C is not read).
// NU <= NV: the vectors of the B sliver that hold columns of C (fewer in the last sliver of a narrow
// C, whose padding would otherwise be computed and thrown away).
// A is read from its packed sliver (ap[k][r]), or, where packing it would cost more than it saves
// (InPlace), from A itself: op(A)(r, k) = a[r * rs + k * cs], rows past C's edge reading the last row.
template <int NU, bool InPlace>
[[gnu::always_inline]] inline void micro_kernel(int64_t kc, const float* ap, int64_t rs, int64_t cs, const float* bp,
                                                float alpha, float beta, float* C, int64_t ldc, int64_t rows,
                                                int64_t cols) {
  const float* arow[MR];
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r) arow[r] = InPlace ? ap + std::min<int64_t>(r, rows - 1) * rs : ap + r;
  if (!InPlace) cs = MR;
  Vec acc[MR][NU] = {};  // (never addressed, so that GCC keeps all of it in registers)
  for (int64_t k = 0; k < kc; ++k) {
    Vec b[NU];
#pragma GCC unroll 4
    for (int v = 0; v < NU; ++v) b[v] = load(bp + k * NR + v * VW);
#pragma GCC unroll 16
    for (int r = 0; r < MR; ++r) {
      const float a = arow[r][k * cs];
#pragma GCC unroll 4
      for (int v = 0; v < NU; ++v) acc[r][v] += a * b[v];
    }
  }
  const int64_t whole = cols / VW;  // vectors wholly inside C (all NU but at C's right edge)
  Vec out[MR][NU];                  // alpha * acc, then + beta * C, for the rows and vectors inside C
#pragma GCC unroll 16
  for (int r = 0; r < MR; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < NU; ++v) {
      out[r][v] = alpha * acc[r][v];
      if (v < whole && r < rows && beta != 0.0f) out[r][v] += beta * load(C + r * ldc + v * VW);
    }
  for (int64_t r = 0; r < rows; ++r) std::memcpy(C + r * ldc, out[r], whole * sizeof(Vec));  // vector stores
  if (whole == NU) return;
  float tile[MR][NU * VW];  // C's right edge: the last cols % VW columns, one by one
  std::memcpy(tile, out, sizeof tile);
  store_edge(&tile[0][whole * VW], NU * VW, rows, cols - whole * VW, beta, C + whole * VW, ldc);
}

// ---- the macro-kernel: the block of C that an A block (mc rows) and a range of B slivers make,
// one micro-tile at a time; the B sliver stays in L1 while the A block's slivers pass under it.
template <int NU, bool InPlace>
void sliver_column(int nu, int64_t mc, int64_t kc, const float* ap, int64_t rs, int64_t cs, const float* bp,
                   float alpha, float beta, float* C, int64_t ldc, int64_t cols) {
  if constexpr (NU > 1)
    if (nu < NU) return sliver_column<NU - 1, InPlace>(nu, mc, kc, ap, rs, cs, bp, alpha, beta, C, ldc, cols);
  for (int64_t ir = 0; ir < mc; ir += MR)  // ir: A slivers
    micro_kernel<NU, InPlace>(kc, InPlace ? ap + ir * rs : ap + ir * kc, rs, cs, bp, alpha, beta, C + ir * ldc, ldc,
                              std::min<int64_t>(MR, mc - ir), cols);
}
// (noinline: inlined into the loops around it, the micro-kernel's 12 accumulators on AVX2 and SSE, 16
// registers, were spilled to memory and it ran at half speed)
template <bool InPlace>
[[gnu::noinline]] void macro_kernel(int64_t mc, int64_t nc, int64_t kc, const float* ap, int64_t rs, int64_t cs, const float* bp,
                  float alpha, float beta, float* C, int64_t ldc) {
  for (int64_t s = 0; s * NR < nc; ++s) {  // jr: B slivers
    const int64_t cols = std::min<int64_t>(NR, nc - s * NR);
    const int nu = static_cast<int>((cols + VW - 1) / VW);
    sliver_column<NV, InPlace>(nu, mc, kc, ap, rs, cs, bp + s * NR * kc, alpha, beta, C + s * NR, ldc, cols);
  }
}

// ---- the five loops around the micro-kernel (Goto and van de Geijn; BLIS's names jc, pc, ic, jr, ir),
// on one thread: C (M, N), its rows ldc floats apart.
void five_loops(const Workspace* ws, const Operand& A, const Operand& B, int64_t M, int64_t N, int64_t K, float alpha,
                float beta, float* C, int64_t ldc) {
  constexpr int64_t KC = kKC, MC = (kMC / MR) * MR, NC = (kNC / NR) * NR;
  PackBuffer bp_buf(ws, Panel::b, std::min(NC, (N + NR - 1) / NR * NR) * std::min(KC, K));
  PackBuffer ap_buf(ws, Panel::a, std::min(MC, (M + MR - 1) / MR * MR) * std::min(KC, K));
  float* bp = bp_buf.data();
  float* ap = ap_buf.data();
  for (int64_t jc = 0; jc < N; jc += NC) {  // loop 5: panels of NC columns of B and C
    const int64_t nc = std::min(NC, N - jc), slivers = (nc + NR - 1) / NR;
    // A narrow C (few B slivers) reads each value of A a few times only: packing A would cost more
    // than it saves (Winograd's small products, the stage-4 convolutions of ResNet-18).
    const bool in_place = slivers <= kInPlaceSlivers;
    for (int64_t pc = 0; pc < K; pc += KC) {  // loop 4: KC of the sum at a time (C adds each panel)
      const int64_t kc = std::min(KC, K - pc);
      const float b = pc == 0 ? beta : 1.0f;
      for (int64_t s = 0; s < slivers; ++s) pack_b(B, pc, kc, jc, nc, s, bp);
      for (int64_t ic = 0; ic < M; ic += MC) {  // loop 3: blocks of MC rows of A and C
        const int64_t mc = std::min(MC, M - ic);
        float* Cb = C + ic * ldc + jc;
        if (in_place) {  // A read where it lies: op(A)(i, k) = A.p[i * rs + k * cs]
          const int64_t rs = A.trans ? 1 : A.ld, cs = A.trans ? A.ld : 1;
          macro_kernel<true>(mc, nc, kc, A.p + ic * rs + pc * cs, rs, cs, bp, alpha, b, Cb, ldc);
        } else {
          pack_a(A, ic, mc, pc, kc, ap);
          macro_kernel<false>(mc, nc, kc, ap, 0, 0, bp, alpha, b, Cb, ldc);
        }
      }
    }
  }
}

// The threads take contiguous blocks of C, cut at micro-tile boundaries (so each value is computed
// as with one thread): blocks of rows, each thread packing all of B, or blocks of columns, each
// packing all of A; whichever shares the slivers out more evenly, rows when C is at least as tall
// as it is wide and both share out as well. One hand-out a call, no waiting between panels.
void gemm(const Ctx& c, const Operand& A, const Operand& B, int64_t M, int64_t N, int64_t K, float alpha, float beta,
          float* C) {
  const int64_t row_slivers = (M + MR - 1) / MR, col_slivers = (N + NR - 1) / NR, t = c.threads;
  const auto evenness = [t](int64_t units) {  // the busiest thread's share of the work, against 1/t
    return static_cast<double>(units) / static_cast<double>((units + t - 1) / t * t);
  };
  const double rows = evenness(row_slivers), cols = evenness(col_slivers);
  const bool by_rows = rows > cols + 0.02 || (rows >= cols - 0.02 && M >= N);
  c.parallel_for(by_rows ? row_slivers : col_slivers, [&](int64_t b, int64_t e) {
    if (by_rows) {
      const int64_t r0 = b * MR, r1 = std::min(M, e * MR);
      const Operand Ab{A.trans ? A.p + r0 : A.p + r0 * A.ld, A.trans, A.ld};
      five_loops(c.workspace, Ab, B, r1 - r0, N, K, alpha, beta, C + r0 * N, N);
    } else {
      const int64_t c0 = b * NR, c1 = std::min(N, e * NR);
      const Operand Bb{B.trans ? B.p + c0 * B.ld : B.p + c0, B.trans, B.ld};
      five_loops(c.workspace, A, Bb, M, c1 - c0, K, alpha, beta, C + c0, N);
    }
  });
}
