// kernel6 of the GEMM family (matmul.cu) and of the 16-bit GEMM (matmul16.cu): C = alpha * op(A) @
// op(B) + beta * C on the tensor cores through PTX itself, below the warp matrix API that kernel5
// uses (kernels/cuda/ptx.cuh). One kernel, two kinds of operands:
//
//   TF32         float operands, mma.sync m16n8k8 (.tf32): each fragment register is rounded to TF32
//                (cvt.rna) after ldmatrix, 24 conversions per 16 products.
//   16-bit       bfloat16 or float16 operands, mma.sync m16n8k16 (.bf16 / .f16): ldmatrix is made for
//                16-bit elements, and its registers (two elements each, the lower k in the low half)
//                go to mma.sync as they are; twice TF32's depth per instruction. Products of two 16-bit
//                values are exact in FP32.
//
// Everything else is counted in bytes, the same for both:
//
//   block tile   128 x 128 of C, 256 threads (8 warps as 2 down M x 4 along N), K in slices of 64 bytes
//                a row (16 floats or 32 16-bit elements).
//   pipeline     three slices in flight: slice s + 2 is copied from global to shared memory with
//                cp.async (no registers on the way, no thread waits for it) while slice s is computed
//                on; cp.async.wait_group 1 then one barrier per slice (kernel5: two barriers, and every
//                element staged through registers).
//   warp tile    64 x 32 of C: 4 x 4 mma tiles of 16 x 8, 64 accumulators a thread, in registers as
//                PTX lays them out (ptx.hpp), so the epilogue writes them without shared memory.
//   fragments    ldmatrix.x4 loads a 16 x 32-byte piece of op(A), or two 8 x 32-byte pieces of op(B),
//                in one instruction: per 32-byte step a warp issues 4 + 2 ldmatrix for 16 mma.sync
//                (kernel5: 6 wmma loads for 8 products of twice the size, each load a pass of its own).
//
// Shared memory: a slice of op(A) is S[m][k] and of op(B) S[n][k], k contiguous (64 bytes a row),
// the row's four 16-byte chunks permuted by an XOR swizzle: chunk c of row r sits at c ^ ((r / 2) % 4).
// ldmatrix reads 8 rows at one chunk; unswizzled, rows r and r + 2 are 128 bytes apart (the same
// banks: 4 reads for one); swizzled, the 8 rows fall in 8 different 16-byte lanes of the 128 banks'
// worth: one pass. The swizzle costs nothing: no padding, and 3 slices of both operands take exactly
// 48 KiB, a block's limit without opting in.
//
// Copies: where op(X) has k contiguous in global memory, 16-byte aligned rows and K a multiple of a
// chunk (4 floats, 8 16-bit elements), each thread copies 2 x 16 bytes of a slice (cp.async.cg);
// otherwise single elements, consecutive threads along the contiguous dimension, each to its
// swizzled place: floats by cp.async.ca of 4 bytes, 16-bit elements by the thread itself (cp.async's
// smallest copy is 4 bytes). Past an edge the copies write zeros (cp.async's source size 0).
//
// Both need sm_80: below it the kernel is built empty and the launchers refuse the device, as for
// kernel5. Under the emulation the same source runs: cp.async's destinations read NaN until waited
// for, ldmatrix and mma.sync exchange the lanes' registers (kernels/emu/ptx.hpp).
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>

#ifdef __CUDACC__
#define D2L_MMA_UNROLL _Pragma("unroll")
#define D2L_MMA_UNROLL_4 _Pragma("unroll 4")
#else
#define D2L_MMA_UNROLL _Pragma("GCC unroll 4")
#define D2L_MMA_UNROLL_4 _Pragma("GCC unroll 4")
#endif

namespace D2L_CUDA_NS {
namespace mma {

constexpr int kBM = 128, kBN = 128, kStages = 3;     // block tile, slices in flight
constexpr int kRowBytes = 64, kChunkBytes = 16;      // a slice's row, and the 16-byte chunks it swizzles
constexpr int kWM = 64, kWN = 32;                    // warp tile
constexpr int kWarpsN = kBN / kWN;                   // 2 x 4 warps
constexpr int kThreads = kBM / kWM * kWarpsN * 32;   // 256
constexpr int kTilesM = kWM / 16, kTilesN = kWN / 8; // mma tiles of a warp: 4 x 4
static_assert(kBM == kBN, "one loader serves both operands");
static_assert(2 * kStages * kBM * kRowBytes <= 48 * 1024, "three slices of both operands in 48 KiB");

// The two kinds of operands: the element E, what a fragment needs before mma.sync, the instruction.
struct Tf32Operands {
  using E = float;
  __device__ __forceinline__ static uint32_t tf32(uint32_t bits) {  // cvt.rna.tf32.f32 of an FP32's bits
    float f;
    memcpy(&f, &bits, 4);
    f = to_tf32(f);
    memcpy(&bits, &f, 4);
    return bits;
  }
  __device__ __forceinline__ static void prepare(uint32_t (&fa)[kTilesM][4], uint32_t (&fb)[kTilesN][2]) {
    D2L_MMA_UNROLL
    for (int i = 0; i < kTilesM; ++i)
      for (int q = 0; q < 4; ++q) fa[i][q] = tf32(fa[i][q]);
    D2L_MMA_UNROLL
    for (int j = 0; j < kTilesN; ++j) fb[j][0] = tf32(fb[j][0]), fb[j][1] = tf32(fb[j][1]);
  }
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    ptx::mma_tf32_m16n8k8(d, a, b);
  }
  // One element: src when in, else a zero (src is then not read).
  __device__ __forceinline__ static void copy_one(float* dst, const float* src, bool in) { ptx::cp_async4(dst, src, in); }
};
template <Float16 F>
struct Operands16 {
  using E = uint16_t;
  __device__ __forceinline__ static void prepare(uint32_t (&)[kTilesM][4], uint32_t (&)[kTilesN][2]) {}
  __device__ __forceinline__ static void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
    if constexpr (F == Float16::bf16) ptx::mma_bf16_m16n8k16(d, a, b);
    else ptx::mma_f16_m16n8k16(d, a, b);
  }
  __device__ __forceinline__ static void copy_one(uint16_t* dst, const uint16_t* src, bool in) {
    *dst = in ? *src : uint16_t{0};
  }
};

// In elements of E: a chunk, a slice's row (its K depth), one mma.sync's depth (32 bytes), a slice.
template <class Ops>
struct Geometry {
  static constexpr int kChunk = kChunkBytes / int(sizeof(typename Ops::E));  // 4 floats, 8 16-bit elements
  static constexpr int kBK = kRowBytes / int(sizeof(typename Ops::E));       // 16 or 32
  static constexpr int kDepth = 2 * kChunk;                                  // m16n8k8 or m16n8k16
  static constexpr int kSlice = kBM * kBK;
  // Where element (r, k) of a slice sits: row r, its 16-byte chunk k / kChunk swizzled.
  __device__ __forceinline__ static int at(int r, int k) {
    return r * kBK + ((k / kChunk) ^ ((r / 2) % 4)) * kChunk + k % kChunk;
  }
};

// This thread's copies of slice (r0, k0) of op(X), X(r, k) = X[r * x_r + k * x_k], rows r0.. r0 + 127,
// into S. vec: k contiguous, rows 16-byte aligned, K a multiple of a chunk (then a chunk is all in or all out).
template <class Ops>
__device__ __forceinline__ void copy_slice(typename Ops::E* S, const typename Ops::E* __restrict__ X, int64_t x_r,
                                           int64_t x_k, bool vec, int64_t r0, int64_t R, int64_t k0, int64_t K) {
  using G = Geometry<Ops>;
  const int t = threadIdx.x;
  if (vec) {
    D2L_MMA_UNROLL
    for (int v = 0; v < G::kSlice / G::kChunk / kThreads; ++v) {  // 2 chunks: 4 threads a row, 64 consecutive bytes
      const int e = t + v * kThreads, r = e / (G::kBK / G::kChunk), k = e % (G::kBK / G::kChunk) * G::kChunk;
      const bool in = r0 + r < R && k0 + k < K;
      ptx::cp_async16(S + G::at(r, k), in ? X + (r0 + r) * x_r + (k0 + k) : X, in);
    }
    return;
  }
  // 8 floats or 16 16-bit elements, neighbours along the contiguous dimension; 4 at a time (unrolled
  // whole, 16 loads' values and addresses beside the 64 accumulators spill registers).
  const bool k_contig = x_k == 1;
  D2L_MMA_UNROLL_4
  for (int v = 0; v < G::kSlice / kThreads; ++v) {
    const int e = t + v * kThreads;
    const int r = k_contig ? e / G::kBK : e % kBM, k = k_contig ? e % G::kBK : e / kBM;
    const bool in = r0 + r < R && k0 + k < K;
    Ops::copy_one(S + G::at(r, k), in ? X + (r0 + r) * x_r + (k0 + k) * x_k : X, in);
  }
}

template <class Ops>
__launch_bounds__(kThreads)
__global__ void matmul_kernel6_mma(int64_t M, int64_t N, int64_t K, float alpha, const typename Ops::E* __restrict__ A,
                                   int64_t a_row, int64_t a_col, const typename Ops::E* __restrict__ B, int64_t b_row,
                                   int64_t b_col, float beta, float* __restrict__ C, bool a_vec, bool b_vec) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 and 16-bit mma.sync: sm_80 and later (the launchers check)
  using E = typename Ops::E;
  using G = Geometry<Ops>;
  // float4: 16-byte aligned, as cp.async's 16-byte copies and ldmatrix's rows need.
  D2L_SHARED(float4, sa4, [kStages][kBM * kRowBytes / 16]);  // op(A)(row0 + m, k0 + k) at at(m, k)
  D2L_SHARED(float4, sb4, [kStages][kBM * kRowBytes / 16]);  // op(B)(k0 + k, col0 + n) at at(n, k)
  auto sa = [&](int64_t s) { return reinterpret_cast<E*>(sa4[s % kStages]); };
  auto sb = [&](int64_t s) { return reinterpret_cast<E*>(sb4[s % kStages]); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.y) * kBM, col0 = int64_t(blockIdx.x) * kBN;
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;
  const int64_t slices = (K + G::kBK - 1) / G::kBK;
  auto load = [&](int64_t s) {  // slice s into its stage, as one cp.async group (empty past the end)
    if (s < slices) {
      copy_slice<Ops>(sa(s), A, a_row, a_col, a_vec, row0, M, s * G::kBK, K);
      copy_slice<Ops>(sb(s), B, b_col, b_row, b_vec, col0, N, s * G::kBK, K);
    }
    ptx::cp_async_commit();
  };
  float acc[kTilesM][kTilesN][4] = {};
  // Slice s + 2 copied while slice s is computed on; kStages - 2 groups pending: slice s's have landed.
  cp_async_pipeline<kStages, kStages - 2>(slices, load, [&](int64_t s) {
    const E* a = sa(s);
    const E* b = sb(s);
    D2L_MMA_UNROLL
    for (int ks = 0; ks < G::kBK / G::kDepth; ++ks) {  // two steps of one mma's depth: chunks 2 ks and 2 ks + 1
      // Lane l points at row l % 8 of matrix l / 8. op(A): matrices (rows 0-7 | 8-15) x (chunk 2 ks |
      // 2 ks + 1), giving a[0..3] as mma.sync wants them; op(B): (n 0-7, chunk 2 ks), (n 0-7, chunk
      // 2 ks + 1), then n 8-15.
      uint32_t fa[kTilesM][4], fb[kTilesN][2];
      D2L_MMA_UNROLL
      for (int i = 0; i < kTilesM; ++i) {
        const int r = wm + 16 * i + (lane / 8 % 2) * 8 + lane % 8;
        ptx::ldmatrix_x4(fa[i], a + G::at(r, G::kDepth * ks + lane / 16 * G::kChunk));
      }
      D2L_MMA_UNROLL
      for (int j = 0; j < kTilesN; j += 2) {
        uint32_t r4[4];
        const int n = wn + 8 * j + (lane / 16) * 8 + lane % 8;
        ptx::ldmatrix_x4(r4, b + G::at(n, G::kDepth * ks + lane / 8 % 2 * G::kChunk));
        fb[j][0] = r4[0], fb[j][1] = r4[1], fb[j + 1][0] = r4[2], fb[j + 1][1] = r4[3];
      }
      Ops::prepare(fa, fb);
      D2L_MMA_UNROLL
      for (int i = 0; i < kTilesM; ++i)
        D2L_MMA_UNROLL
        for (int j = 0; j < kTilesN; ++j) Ops::mma(acc[i][j], fa[i], fb[j]);
    }
  });
  // Epilogue: d[q] of tile (i, j) is C(g + 8 (q / 2), 2 t + q % 2) of the tile, g = lane / 4, t = lane % 4.
  const int g = lane / 4, t = lane % 4;
  D2L_MMA_UNROLL
  for (int i = 0; i < kTilesM; ++i)
    D2L_MMA_UNROLL
    for (int j = 0; j < kTilesN; ++j)
      for (int q = 0; q < 4; ++q) {
        const int64_t r = row0 + wm + 16 * i + g + 8 * (q / 2), c = col0 + wn + 8 * j + 2 * t + q % 2;
        if (r < M && c < N) gemm_store(&C[r * N + c], alpha, acc[i][j][q], beta);
      }
#endif
}

// The launch, for either kind of operands (the caller has checked the device).
template <class Ops>
void launch(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const typename Ops::E* A,
            const typename Ops::E* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  const int64_t a_row = ta ? 1 : K, a_col = ta ? M : 1;  // op(A)(m, k) = A[m * a_row + k * a_col]
  const int64_t b_row = tb ? 1 : N, b_col = tb ? K : 1;  // op(B)(k, n) = B[k * b_row + n * b_col]
  // 16-byte copies: k contiguous, 16-byte aligned rows (base and row length), K a multiple of a chunk.
  constexpr int chunk = Geometry<Ops>::kChunk;
  const bool a_vec = !ta && reinterpret_cast<uintptr_t>(A) % 16 == 0 && K % chunk == 0;
  const bool b_vec = tb && reinterpret_cast<uintptr_t>(B) % 16 == 0 && K % chunk == 0;
  const int64_t gx = (N + kBN - 1) / kBN, gy = (M + kBM - 1) / kBM;
  if (gx > 2147483647 || gy > 65535) throw std::invalid_argument("gemm: M or N too large for one grid");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block(kThreads);
  D2L_LAUNCH(matmul_kernel6_mma<Ops>, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row, b_col, beta, C,
                                                              a_vec, b_vec);
  D2L_CHECK_LAUNCH(matmul_kernel6_mma<Ops>);
}

}  // namespace mma

void gemm_mma(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              const float* B, float beta, float* C) {
  if (!device_has_tf32())
    throw std::invalid_argument("gemm: GemmKernel::mma needs TF32 tensor cores (compute capability 8.0 or later)");
  mma::launch<mma::Tf32Operands>(stream, ta, tb, M, N, K, alpha, A, B, beta, C);
}

void gemm16_mma(Stream stream, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (!device_has_tf32())
    throw std::invalid_argument("gemm16: GemmKernel::mma needs 16-bit tensor cores with mma.sync m16n8k16 "
                                "(compute capability 8.0 or later)");
  if (f == Float16::bf16) mma::launch<mma::Operands16<Float16::bf16>>(stream, ta, tb, M, N, K, alpha, A, B, beta, C);
  else mma::launch<mma::Operands16<Float16::f16>>(stream, ta, tb, M, N, K, alpha, A, B, beta, C);
}

}  // namespace D2L_CUDA_NS
