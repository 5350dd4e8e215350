// kernel6 of the GEMM family (matmul.cu): C = alpha * op(A) @ op(B) + beta * C in TF32 on the tensor
// cores through PTX itself, below the warp matrix API that kernel5 uses (kernels/cuda/ptx.cuh):
//
//   block tile   128 x 128 of C, 256 threads (8 warps as 2 down M x 4 along N), K in slices of 16.
//   pipeline     three slices in flight: slice s + 2 is copied from global to shared memory with
//                cp.async (no registers on the way, no thread waits for it) while slice s is computed
//                on; cp.async.wait_group 1 then one barrier per slice (kernel5: two barriers, and every
//                element staged through registers).
//   warp tile    64 x 32 of C: 4 x 4 tiles of mma.sync m16n8k8, 64 accumulators a thread, in registers
//                as PTX lays them out (ptx.hpp), so the epilogue writes them without shared memory.
//   fragments    ldmatrix.x4 loads a 16 x 8 piece of op(A), or two 8 x 8 pieces of op(B), in one
//                instruction: per 8-deep step a warp issues 4 + 2 ldmatrix for 16 mma.sync (kernel5:
//                6 wmma loads for 8 products of twice the size, each load a pass of its own).
//
// Shared memory: a slice of op(A) is S[m][k] and of op(B) S[n][k], k contiguous (16 floats, 64 bytes
// a row), the row's four 16-byte chunks permuted by an XOR swizzle: chunk c of row r sits at
// c ^ ((r / 2) % 4). ldmatrix reads 8 rows at one chunk; unswizzled, rows r and r + 2 are 128 bytes
// apart (the same banks: 4 reads for one); swizzled, the 8 rows fall in 8 different 16-byte lanes of
// the 128 banks' worth: one pass. The swizzle costs nothing: no padding, and 3 slices of both
// operands take exactly 48 KiB, a block's limit without opting in.
//
// Copies: where op(X) has k contiguous in global memory, 16-byte aligned rows and K a multiple of 4,
// each thread copies 2 x 16 bytes of a slice (cp.async.cg); otherwise 8 x 4 bytes (cp.async.ca),
// consecutive threads along the contiguous dimension, each element to its swizzled place. Past an
// edge the copies write zeros (cp.async's source size 0). The operands reach shared memory as FP32:
// each fragment register is rounded to TF32 (cvt.rna) after ldmatrix, 24 conversions per 16 products.
//
// TF32 needs sm_80: below it the kernel is built empty and the launcher refuses the device, as for
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
#else
#define D2L_MMA_UNROLL _Pragma("GCC unroll 4")
#endif

namespace D2L_CUDA_NS {
namespace mma {

constexpr int kBM = 128, kBN = 128, kBK = 16, kStages = 3;  // block tile, K slice, slices in flight
constexpr int kWM = 64, kWN = 32;                          // warp tile
constexpr int kWarpsN = kBN / kWN;                         // 2 x 4 warps
constexpr int kThreads = kBM / kWM * kWarpsN * 32;         // 256
constexpr int kTilesM = kWM / 16, kTilesN = kWN / 8;       // mma tiles of a warp: 4 x 4
constexpr int kSlice = kBM * kBK;                          // floats of one operand's slice
static_assert(kBM == kBN, "one loader serves both operands");
static_assert(2 * kStages * kSlice * 4 <= 48 * 1024, "three slices of both operands in 48 KiB");

// Where element (r, k) of a slice sits: row r of 16 floats, its 16-byte chunk k / 4 swizzled.
__device__ __forceinline__ int at(int r, int k) { return r * kBK + ((k / 4) ^ ((r / 2) % 4)) * 4 + k % 4; }

// This thread's copies of slice (r0, k0) of op(X), X(r, k) = X[r * x_r + k * x_k], rows r0.. r0 + 127,
// into S. vec: k contiguous, rows 16-byte aligned, K % 4 == 0 (then a chunk is all in or all out).
__device__ __forceinline__ void copy_slice(float* S, const float* __restrict__ X, int64_t x_r, int64_t x_k, bool vec,
                                           int64_t r0, int64_t R, int64_t k0, int64_t K) {
  const int t = threadIdx.x;
  if (vec) {
    D2L_MMA_UNROLL
    for (int v = 0; v < kSlice / 4 / kThreads; ++v) {  // 2 chunks: 4 threads a row, 64 consecutive bytes
      const int e = t + v * kThreads, r = e / (kBK / 4), k = e % (kBK / 4) * 4;
      const bool in = r0 + r < R && k0 + k < K;
      ptx::cp_async16(S + at(r, k), in ? X + (r0 + r) * x_r + (k0 + k) : X, in);
    }
    return;
  }
  const bool k_contig = x_k == 1;
  D2L_MMA_UNROLL
  for (int v = 0; v < kSlice / kThreads; ++v) {  // 8 elements, neighbours along the contiguous dimension
    const int e = t + v * kThreads;
    const int r = k_contig ? e / kBK : e % kBM, k = k_contig ? e % kBK : e / kBM;
    const bool in = r0 + r < R && k0 + k < K;
    ptx::cp_async4(S + at(r, k), in ? X + (r0 + r) * x_r + (k0 + k) * x_k : X, in);
  }
}

__device__ __forceinline__ uint32_t tf32(uint32_t bits) {  // cvt.rna.tf32.f32 of an FP32's bits
  float f;
  memcpy(&f, &bits, 4);
  f = to_tf32(f);
  memcpy(&bits, &f, 4);
  return bits;
}

__launch_bounds__(kThreads)
__global__ void matmul_kernel6_mma(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                   int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                   int64_t b_col, float beta, float* __restrict__ C, bool a_vec, bool b_vec) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 tensor cores: sm_80 and later (the launcher checks)
  // float4: 16-byte aligned, as cp.async's 16-byte copies and ldmatrix's rows need.
  D2L_SHARED(float4, sa4, [kStages][kSlice / 4]);  // op(A)(row0 + m, k0 + k) at at(m, k)
  D2L_SHARED(float4, sb4, [kStages][kSlice / 4]);  // op(B)(k0 + k, col0 + n) at at(n, k)
  auto sa = [&](int64_t s) { return reinterpret_cast<float*>(sa4[s % kStages]); };
  auto sb = [&](int64_t s) { return reinterpret_cast<float*>(sb4[s % kStages]); };
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t row0 = int64_t(blockIdx.y) * kBM, col0 = int64_t(blockIdx.x) * kBN;
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;
  const int64_t slices = (K + kBK - 1) / kBK;
  auto load = [&](int64_t s) {  // slice s into its stage, as one cp.async group (empty past the end)
    if (s < slices) {
      copy_slice(sa(s), A, a_row, a_col, a_vec, row0, M, s * kBK, K);
      copy_slice(sb(s), B, b_col, b_row, b_vec, col0, N, s * kBK, K);
    }
    ptx::cp_async_commit();
  };
  float acc[kTilesM][kTilesN][4] = {};
  // Slice s + 2 copied while slice s is computed on; kStages - 2 groups pending: slice s's have landed.
  cp_async_pipeline<kStages, kStages - 2>(slices, load, [&](int64_t s) {
    const float* a = sa(s);
    const float* b = sb(s);
    D2L_MMA_UNROLL
    for (int ks = 0; ks < kBK / 8; ++ks) {  // two 8-deep steps: 16-byte chunks 2 ks and 2 ks + 1
      // Lane l points at row l % 8 of matrix l / 8. op(A): matrices (rows 0-7 | 8-15) x (k 0-3 | 4-7),
      // giving a[0..3] as mma.sync wants them; op(B): (n 0-7, k 0-3), (n 0-7, k 4-7), then n 8-15.
      uint32_t fa[kTilesM][4], fb[kTilesN][2];
      D2L_MMA_UNROLL
      for (int i = 0; i < kTilesM; ++i) {
        const int r = wm + 16 * i + (lane / 8 % 2) * 8 + lane % 8;
        ptx::ldmatrix_x4(fa[i], a + at(r, 8 * ks + lane / 16 * 4));
      }
      D2L_MMA_UNROLL
      for (int j = 0; j < kTilesN; j += 2) {
        uint32_t r4[4];
        const int n = wn + 8 * j + (lane / 16) * 8 + lane % 8;
        ptx::ldmatrix_x4(r4, b + at(n, 8 * ks + lane / 8 % 2 * 4));
        fb[j][0] = r4[0], fb[j][1] = r4[1], fb[j + 1][0] = r4[2], fb[j + 1][1] = r4[3];
      }
      D2L_MMA_UNROLL
      for (int i = 0; i < kTilesM; ++i)
        for (int q = 0; q < 4; ++q) fa[i][q] = tf32(fa[i][q]);
      D2L_MMA_UNROLL
      for (int j = 0; j < kTilesN; ++j) fb[j][0] = tf32(fb[j][0]), fb[j][1] = tf32(fb[j][1]);
      D2L_MMA_UNROLL
      for (int i = 0; i < kTilesM; ++i)
        D2L_MMA_UNROLL
        for (int j = 0; j < kTilesN; ++j) ptx::mma_tf32_m16n8k8(acc[i][j], fa[i], fb[j]);
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

}  // namespace mma

void gemm_mma(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              const float* B, float beta, float* C) {
  if (!device_has_tf32())
    throw std::invalid_argument("gemm: GemmKernel::mma needs TF32 tensor cores (compute capability 8.0 or later)");
  if (M <= 0 || N <= 0) return;
  const int64_t a_row = ta ? 1 : K, a_col = ta ? M : 1;  // op(A)(m, k) = A[m * a_row + k * a_col]
  const int64_t b_row = tb ? 1 : N, b_col = tb ? K : 1;  // op(B)(k, n) = B[k * b_row + n * b_col]
  // 16-byte copies: k contiguous, 16-byte aligned rows (base and row length), K % 4 == 0.
  const bool a_vec = !ta && reinterpret_cast<uintptr_t>(A) % 16 == 0 && K % 4 == 0;
  const bool b_vec = tb && reinterpret_cast<uintptr_t>(B) % 16 == 0 && K % 4 == 0;
  const int64_t gx = (N + mma::kBN - 1) / mma::kBN, gy = (M + mma::kBM - 1) / mma::kBM;
  if (gx > 2147483647 || gy > 65535) throw std::invalid_argument("gemm: M or N too large for one grid");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block(mma::kThreads);
  using mma::matmul_kernel6_mma;
  D2L_LAUNCH(matmul_kernel6_mma, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row, b_col, beta, C,
                                                         a_vec, b_vec);
  D2L_CHECK_LAUNCH(matmul_kernel6_mma);
}

}  // namespace D2L_CUDA_NS
