// GEMM kernel3: Goto and van de Geijn's GEMM, as BLIS writes it: five loops around a micro-kernel.
// The family, its reference (kernel1) and the choice between the members are in gemm.cpp.
//
// kernel2 keeps a block of B in cache; kernel3 also keeps a tile of C in registers for a whole panel
// of the sum, and copies ("packs") the blocks of A and B it works on into buffers laid out in the
// order the micro-kernel reads them:
//
//     for jc in steps of NC:                 loop 5: a panel of B's columns      (Bp: L3)
//       for pc in steps of KC:               loop 4: a panel of the sum's index  pack Bp = op(B)[pc.., jc..]
//         for ic in steps of MC:             loop 3: a block of A's rows         pack Ap = op(A)[ic.., pc..]  (L2)
//           for jr in steps of NR:           loop 2: a sliver of Bp              (L1)
//             for ir in steps of MR:         loop 1: a sliver of Ap
//               C[ic+ir.., jc+jr..] (MR x NR) += Ap sliver @ Bp sliver     the micro-kernel (registers)
//
// Packing is where transposes are handled: op(A) and op(B) are read through their strides once per
// panel, and the micro-kernel sees the same layout either way. The micro-kernel's
// vector width comes from the CPU at run time (set_gemm_isa forces one): AVX-512 (16 floats), AVX2
// with FMA (8) or a portable build (4: SSE's registers); the loops (gemm_packed_loops.hpp) are compiled
// once per ISA, as conv2d's kernel4 is. Threads take blocks of C's rows or columns; each value
// of C is the same sum in the same order (panel by panel, k ascending in each) whoever computes it,
// so C does not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

// op(X) of a row-major matrix: X as stored, or its transpose; ld is the stored row length.
struct Operand {
  const float* p;
  bool trans;
  int64_t ld;
};

// Block sizes (floats): a KC x NR sliver of B stays in L1 (24 KiB at NR = 32), an MC x KC block of A
// in L2 (about 120 KiB), a KC x NC panel of B in L3 (3 MiB). bench/README.md "GEMM" has the tables.
constexpr int64_t kKC = 192, kMC = 160, kNC = 4096;
constexpr int64_t kInPlaceSlivers = 4;  // up to this many B slivers in a panel, A is not packed

// The packing buffers: the device's workspace when the call has one (so that they count in its
// memory), else a buffer each thread keeps from call to call (GEMMs called outside a device's Ctx:
// the Winograd member's many small ones, im2col's per-image ones), so that a small product does not
// pay for an allocation.
enum class Panel { a, b };
class PackBuffer {
 public:
  PackBuffer(const Workspace* ws, Panel which, int64_t n) : scratch_(ws, ws ? n : 0) {
    if (ws) {
      p_ = scratch_.data();
      return;
    }
    thread_local std::vector<float> a_panel, b_panel;
    std::vector<float>& v = which == Panel::a ? a_panel : b_panel;
    if (static_cast<int64_t>(v.size()) < n) v.resize(static_cast<size_t>(n));
    p_ = v.data();
  }
  float* data() const { return p_; }

 private:
  Scratch<float> scratch_;
  float* p_;
};

// At C's edges (the last rows and columns, where M and N are not multiples of the micro-tile): the
// rows x cols corner of a finished tile (alpha * sums, ld floats a row) that lies inside C.
void store_edge(const float* tile, int64_t ld, int64_t rows, int64_t cols, float beta, float* C, int64_t ldc) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < cols; ++j) C[r * ldc + j] = tile[r * ld + j] + (beta == 0.0f ? 0.0f : beta * C[r * ldc + j]);
}

#if defined(__x86_64__) && defined(__GNUC__)
// AVX-512: 32 registers; 8 x 48 floats of C = 24 accumulators, 3 for B's row, 1 for A's broadcast
// (8 rows: the channel counts of the networks are multiples of 8, so no sliver of A is cut short).
#pragma GCC push_options
#pragma GCC target("avx512f,avx512vl,avx2,fma")
namespace avx512 {
constexpr int VW = 16, NV = 3, MR = 8;
#include "gemm_packed_loops.hpp"
}  // namespace avx512
#pragma GCC pop_options
// AVX2: 16 registers; 6 x 16 floats of C = 12 accumulators, 2 for B's row, 1 for the broadcast.
#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
constexpr int VW = 8, NV = 2, MR = 6;
#include "gemm_packed_loops.hpp"
}  // namespace avx2
#pragma GCC pop_options
#endif
// portable (SSE2 on x86-64): 16 registers of 4 floats; 6 x 8 floats of C = 12 accumulators.
namespace portable {
constexpr int VW = 4, NV = 2, MR = 6;
#include "gemm_packed_loops.hpp"
}  // namespace portable

std::atomic<VectorIsa> g_isa{best_vector_isa()};

}  // namespace

VectorIsa gemm_isa() { return g_isa.load(std::memory_order_relaxed); }
void set_gemm_isa(VectorIsa isa) { g_isa.store(isa, std::memory_order_relaxed); }

void gemm_packed(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 const float* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return gemm_scale(c, M * N, beta, C);
  const Operand a{A, ta, ta ? M : K}, b{B, tb, tb ? K : N};
  switch (gemm_isa()) {
#if defined(__x86_64__) && defined(__GNUC__)
    case VectorIsa::avx512: return avx512::gemm(c, a, b, M, N, K, alpha, beta, C);
    case VectorIsa::avx2: return avx2::gemm(c, a, b, M, N, K, alpha, beta, C);
#endif
    default: return portable::gemm(c, a, b, M, N, K, alpha, beta, C);
  }
}

}  // namespace d2l::kernels::cpu
