// kernel6 of the 16-bit GEMM (matmul16.cu's contract): C = alpha * op(A) @ op(B) + beta * C with A and
// B bfloat16 or float16 and the sums in float32, on the tensor cores through mma.sync m16n8k16.
// matmul_mma.cu's TF32 kernel6 with 16-bit operands; what changes:
//
//   K slice      32 elements, so a row of a slice is 64 bytes as there (16 floats), and the same
//                swizzle serves: chunk c (8 elements) of row r sits at c ^ ((r / 2) % 4).
//   fragments    ldmatrix is made for 16-bit elements: one ldmatrix.x4 is a whole 16 x 16 operand of
//                op(A), in the registers mma.sync wants (a[0..3], two elements each, the lower k in the
//                low half), or the 16 x 8 operands of op(B) for two tiles along N.
//   products     per 16-deep step a warp issues 4 + 2 ldmatrix for 16 mma.sync of 16 x 8 x 16: twice
//                TF32's depth per instruction, and no conversion (TF32 rounds every register first).
//   copies       16 bytes (8 elements) with cp.async where op(X) has k contiguous, 16-byte aligned rows
//                and K % 8 == 0; otherwise each thread loads 16 single elements and stores them to
//                shared memory itself (cp.async's smallest copy is 4 bytes, two elements).
//
// Products of two 16-bit values are exact in float32; the tensor core adds them to the float32
// accumulators (the emulation in k order, kernels/emu/ptx.hpp). Needs sm_80, as TF32: below it the
// kernel is built empty and the launcher refuses the device.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>

#ifdef __CUDACC__
#define D2L_MMA16_UNROLL _Pragma("unroll")
#define D2L_MMA16_UNROLL_4 _Pragma("unroll 4")
#else
#define D2L_MMA16_UNROLL _Pragma("GCC unroll 4")
#define D2L_MMA16_UNROLL_4 _Pragma("GCC unroll 4")
#endif

namespace D2L_CUDA_NS {
namespace mma16 {

constexpr int kBM = 128, kBN = 128, kBK = 32, kStages = 3;  // block tile, K slice, slices in flight
constexpr int kWM = 64, kWN = 32;                          // warp tile
constexpr int kWarpsN = kBN / kWN;                         // 2 x 4 warps
constexpr int kThreads = kBM / kWM * kWarpsN * 32;         // 256
constexpr int kTilesM = kWM / 16, kTilesN = kWN / 8;       // mma tiles of a warp: 4 x 4
constexpr int kSlice = kBM * kBK;                          // elements of one operand's slice
static_assert(kBM == kBN, "one loader serves both operands");
static_assert(2 * kStages * kSlice * 2 <= 48 * 1024, "three slices of both operands within 48 KiB");

// Where element (r, k) of a slice sits: row r of 32 elements, its 16-byte chunk k / 8 swizzled.
__device__ __forceinline__ int at(int r, int k) { return r * kBK + ((k / 8) ^ ((r / 2) % 4)) * 8 + k % 8; }

// This thread's copies of slice (r0, k0) of op(X), X(r, k) = X[r * x_r + k * x_k], rows r0.. r0 + 127,
// into S. vec: k contiguous, rows 16-byte aligned, K % 8 == 0 (a chunk is then all in or all out).
__device__ __forceinline__ void copy_slice(uint16_t* S, const uint16_t* __restrict__ X, int64_t x_r, int64_t x_k,
                                           bool vec, int64_t r0, int64_t R, int64_t k0, int64_t K) {
  const int t = threadIdx.x;
  if (vec) {
    D2L_MMA16_UNROLL
    for (int v = 0; v < kSlice / 8 / kThreads; ++v) {  // 2 chunks: 4 threads a row, 64 consecutive bytes
      const int e = t + v * kThreads, r = e / (kBK / 8), k = e % (kBK / 8) * 8;
      const bool in = r0 + r < R && k0 + k < K;
      ptx::cp_async16(S + at(r, k), in ? X + (r0 + r) * x_r + (k0 + k) : X, in);
    }
    return;
  }
  // 16 elements, neighbours along the contiguous dimension; 4 at a time (unrolled whole, the loads'
  // values and addresses beside the 64 accumulators spill registers).
  const bool k_contig = x_k == 1;
  D2L_MMA16_UNROLL_4
  for (int v = 0; v < kSlice / kThreads; ++v) {
    const int e = t + v * kThreads;
    const int r = k_contig ? e / kBK : e % kBM, k = k_contig ? e % kBK : e / kBM;
    const bool in = r0 + r < R && k0 + k < K;
    S[at(r, k)] = in ? X[(r0 + r) * x_r + (k0 + k) * x_k] : uint16_t{0};
  }
}

template <Float16 F>
__launch_bounds__(kThreads)
__global__ void matmul16_kernel6_mma(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* __restrict__ A,
                                     int64_t a_row, int64_t a_col, const uint16_t* __restrict__ B, int64_t b_row,
                                     int64_t b_col, float beta, float* __restrict__ C, bool a_vec, bool b_vec) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // 16-bit mma.sync m16n8k16: sm_80 and later
  // float4 storage: 16-byte aligned, as cp.async's 16-byte copies and ldmatrix's rows need (8 elements each).
  D2L_SHARED(float4, sa4, [kStages][kSlice / 8]);  // op(A)(row0 + m, k0 + k) at at(m, k)
  D2L_SHARED(float4, sb4, [kStages][kSlice / 8]);  // op(B)(k0 + k, col0 + n) at at(n, k)
  auto sa = [&](int64_t s) { return reinterpret_cast<uint16_t*>(sa4[s % kStages]); };
  auto sb = [&](int64_t s) { return reinterpret_cast<uint16_t*>(sb4[s % kStages]); };
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
    const uint16_t* a = sa(s);
    const uint16_t* b = sb(s);
    D2L_MMA16_UNROLL
    for (int ks = 0; ks < kBK / 16; ++ks) {  // two 16-deep steps: chunks 2 ks and 2 ks + 1
      // Lane l points at row l % 8 of matrix l / 8. op(A): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15),
      // giving a[0..3] as mma.sync wants them; op(B): (n 0-7, k 0-7), (n 0-7, k 8-15), then n 8-15.
      uint32_t fa[kTilesM][4], fb[kTilesN][2];
      D2L_MMA16_UNROLL
      for (int i = 0; i < kTilesM; ++i) {
        const int r = wm + 16 * i + (lane / 8 % 2) * 8 + lane % 8;
        ptx::ldmatrix_x4(fa[i], a + at(r, 16 * ks + lane / 16 * 8));
      }
      D2L_MMA16_UNROLL
      for (int j = 0; j < kTilesN; j += 2) {
        uint32_t r4[4];
        const int n = wn + 8 * j + (lane / 16) * 8 + lane % 8;
        ptx::ldmatrix_x4(r4, b + at(n, 16 * ks + lane / 8 % 2 * 8));
        fb[j][0] = r4[0], fb[j][1] = r4[1], fb[j + 1][0] = r4[2], fb[j + 1][1] = r4[3];
      }
      D2L_MMA16_UNROLL
      for (int i = 0; i < kTilesM; ++i)
        D2L_MMA16_UNROLL
        for (int j = 0; j < kTilesN; ++j) {
          if constexpr (F == Float16::bf16) ptx::mma_bf16_m16n8k16(acc[i][j], fa[i], fb[j]);
          else ptx::mma_f16_m16n8k16(acc[i][j], fa[i], fb[j]);
        }
    }
  });
  // Epilogue: d[q] of tile (i, j) is C(g + 8 (q / 2), 2 t + q % 2) of the tile, g = lane / 4, t = lane % 4.
  const int g = lane / 4, t = lane % 4;
  D2L_MMA16_UNROLL
  for (int i = 0; i < kTilesM; ++i)
    D2L_MMA16_UNROLL
    for (int j = 0; j < kTilesN; ++j)
      for (int q = 0; q < 4; ++q) {
        const int64_t r = row0 + wm + 16 * i + g + 8 * (q / 2), c = col0 + wn + 8 * j + 2 * t + q % 2;
        if (r < M && c < N) gemm_store(&C[r * N + c], alpha, acc[i][j][q], beta);
      }
#endif
}

}  // namespace mma16

void gemm16_mma(Stream stream, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (!device_has_tf32())
    throw std::invalid_argument("gemm16: GemmKernel::mma needs 16-bit tensor cores with mma.sync m16n8k16 "
                                "(compute capability 8.0 or later)");
  if (M <= 0 || N <= 0) return;
  const int64_t a_row = ta ? 1 : K, a_col = ta ? M : 1;  // op(A)(m, k) = A[m * a_row + k * a_col]
  const int64_t b_row = tb ? 1 : N, b_col = tb ? K : 1;  // op(B)(k, n) = B[k * b_row + n * b_col]
  // 16-byte copies: k contiguous, 16-byte aligned rows (base and row length), K % 8 == 0.
  const bool a_vec = !ta && reinterpret_cast<uintptr_t>(A) % 16 == 0 && K % 8 == 0;
  const bool b_vec = tb && reinterpret_cast<uintptr_t>(B) % 16 == 0 && K % 8 == 0;
  const int64_t gx = (N + mma16::kBN - 1) / mma16::kBN, gy = (M + mma16::kBM - 1) / mma16::kBM;
  if (gx > 2147483647 || gy > 65535) throw std::invalid_argument("gemm16: M or N too large for one grid");
  const dim3 grid(static_cast<unsigned>(gx), static_cast<unsigned>(gy)), block(mma16::kThreads);
  using mma16::matmul16_kernel6_mma;
  if (f == Float16::bf16) {
    D2L_LAUNCH(matmul16_kernel6_mma<Float16::bf16>, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                            b_col, beta, C, a_vec, b_vec);
    D2L_CHECK_LAUNCH(matmul16_kernel6_mma<Float16::bf16>);
  } else {
    D2L_LAUNCH(matmul16_kernel6_mma<Float16::f16>, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                           b_col, beta, C, a_vec, b_vec);
    D2L_CHECK_LAUNCH(matmul16_kernel6_mma<Float16::f16>);
  }
}

}  // namespace D2L_CUDA_NS
