// GEMM on the GPU: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major; the
// contract of kernels/cpu gemm (kernels/cpu/gemm.cpp is the CPU reference; tests compare them).
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)).
//
// The kernel family (pick one with GemmKernel; the framework's choice is made by the caller):
//   kernel1 naive     one thread per element of C, a dot product straight from global memory:
//                     the simplest correct kernel; 2 global loads per multiply-add.
//   kernel2 tiled     a 16x16 block stages 16x16 tiles of op(A) and op(B) in shared memory (two
//                     __syncthreads per step: tile full / tile consumed): each global element is
//                     loaded by a block once instead of 16 times.
//   kernel3 regblock  a 256-thread block computes a 64x64 tile of C, each thread a 4x4 micro-tile
//                     held in registers, from 64x16 / 16x64 shared tiles: 8 shared loads feed 16
//                     multiply-adds (kernel2: 2 loads per multiply-add).
//
// Transposes are strides: op(A)(i, k) = A[i * a_row + k * a_col], op(B)(k, j) = B[k * b_row + j * b_col].
// Sizes need not be multiples of the tiles: loads past an edge read 0, stores past it are skipped.
// Built twice (kernels/cuda/d2l_cuda.cuh): nvcc -> d2l::kernels::cuda, g++ + kernels/emu -> d2l::kernels::emu.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"

#include <stdexcept>
#include <string>

namespace D2L_CUDA_NS {

// C = alpha * acc + beta * C; with beta == 0, C is not read (it may hold garbage, as in BLAS).
__device__ __forceinline__ void gemm_store(float* c, float alpha, float acc, float beta) {
  *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
}

// ---- kernel1: grid (ceil(N/16), ceil(M/16)), block (16, 16). x runs along a row of C, so
// neighbouring threads read neighbouring B and write neighbouring C.
__global__ void matmul_kernel1_naive(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                     int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                     int64_t b_col, float beta, float* __restrict__ C) {
  const int64_t i = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;  // row of C
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;  // column of C
  if (i >= M || j >= N) return;
  float acc = 0.0f;
  for (int64_t k = 0; k < K; ++k) acc += A[i * a_row + k * a_col] * B[k * b_row + j * b_col];
  gemm_store(&C[i * N + j], alpha, acc, beta);
}

// ---- kernel2: grid (ceil(N/16), ceil(M/16)), block (kTile, kTile); thread (ty, tx) owns C[i][j].
constexpr int kTile = 16;

__global__ void matmul_kernel2_tiled(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                     int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                     int64_t b_col, float beta, float* __restrict__ C) {
  D2L_SHARED(float, As, [kTile][kTile]);  // As[r][k] = op(A)(row0 + r, k0 + k)
  D2L_SHARED(float, Bs, [kTile][kTile]);  // Bs[k][c] = op(B)(k0 + k, col0 + c)
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = int64_t(blockIdx.y) * kTile + ty, j = int64_t(blockIdx.x) * kTile + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile) {
    // Every thread loads (zeros past the edges) and reaches both barriers, even outside C.
    As[ty][tx] = (i < M && k0 + tx < K) ? A[i * a_row + (k0 + tx) * a_col] : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && j < N) ? B[(k0 + ty) * b_row + j * b_col] : 0.0f;
    __syncthreads();  // the tiles are complete before anyone reads them
    for (int k = 0; k < kTile; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();  // everyone has read them before the next step overwrites them
  }
  if (i < M && j < N) gemm_store(&C[i * N + j], alpha, acc, beta);
}

// ---- kernel3: grid (ceil(N/64), ceil(M/64)), block 256 (1-D). Thread t = (ty, tx) = (t / 16, t % 16)
// owns rows ty + 16 m and columns tx + 16 n of the block's tile, m, n in [0, 4): strided so that a
// warp reads consecutive shared words (no bank conflicts) and writes consecutive C elements.
constexpr int kBM = 64, kBN = 64, kBK = 16;  // block tile of C, and the K step
constexpr int kTM = 4, kTN = 4;              // micro-tile of one thread
constexpr int kTX = kBN / kTN, kTY = kBM / kTM;  // 16 x 16 threads
constexpr int kRegThreads = kTX * kTY;           // 256

__global__ void matmul_kernel3_regblock(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                        int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                        int64_t b_col, float beta, float* __restrict__ C) {
  D2L_SHARED(float, As, [kBK][kBM]);  // As[k][r] = op(A)(row0 + r, k0 + k): transposed, so a thread's
                                      // rows for one k are one row of As
  D2L_SHARED(float, Bs, [kBK][kBN]);  // Bs[k][c] = op(B)(k0 + k, col0 + c)
  const int t = threadIdx.x, tx = t % kTX, ty = t / kTX;
  const int64_t row0 = int64_t(blockIdx.y) * kBM, col0 = int64_t(blockIdx.x) * kBN;
  float acc[kTM][kTN] = {};
  for (int64_t k0 = 0; k0 < K; k0 += kBK) {
    // 256 threads fill 64x16 elements of each tile: 4 each. Consecutive threads take consecutive k
    // for A and consecutive columns for B (contiguous in memory when not transposed).
    for (int e = t; e < kBM * kBK; e += kRegThreads) {
      const int r = e / kBK, k = e % kBK;
      const int64_t gi = row0 + r, gk = k0 + k;
      As[k][r] = (gi < M && gk < K) ? A[gi * a_row + gk * a_col] : 0.0f;
    }
    for (int e = t; e < kBK * kBN; e += kRegThreads) {
      const int k = e / kBN, c = e % kBN;
      const int64_t gk = k0 + k, gj = col0 + c;
      Bs[k][c] = (gk < K && gj < N) ? B[gk * b_row + gj * b_col] : 0.0f;
    }
    __syncthreads();  // tiles complete
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];  // one column of the A micro-tile, one row of the B micro-tile
      for (int m = 0; m < kTM; ++m) a[m] = As[k][ty + kTY * m];
      for (int n = 0; n < kTN; ++n) b[n] = Bs[k][tx + kTX * n];
      for (int m = 0; m < kTM; ++m)
        for (int n = 0; n < kTN; ++n) acc[m][n] += a[m] * b[n];  // outer product: 16 FMAs
    }
    __syncthreads();  // tiles consumed
  }
  for (int m = 0; m < kTM; ++m)
    for (int n = 0; n < kTN; ++n) {
      const int64_t i = row0 + ty + kTY * m, j = col0 + tx + kTX * n;
      if (i < M && j < N) gemm_store(&C[i * N + j], alpha, acc[m][n], beta);
    }
}

// ---- launcher
namespace {
unsigned blocks_for(int64_t n, int64_t tile, const char* what) {
  const int64_t b = (n + tile - 1) / tile;
  if (b > 65535) throw std::invalid_argument(std::string("gemm: ") + what + " too large for one grid");
  return static_cast<unsigned>(b);
}
}  // namespace

void gemm(Stream stream, GemmKernel kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  const int64_t a_row = ta ? 1 : K, a_col = ta ? M : 1;  // A stored (K, M) when ta, else (M, K)
  const int64_t b_row = tb ? 1 : N, b_col = tb ? K : 1;  // B stored (N, K) when tb, else (K, N)
  switch (kernel) {
    case GemmKernel::naive: {
      const dim3 grid(blocks_for(N, 16, "N"), blocks_for(M, 16, "M")), block(16, 16);
      D2L_LAUNCH(matmul_kernel1_naive, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row, b_col,
                                                                beta, C);
      D2L_CHECK_LAUNCH(matmul_kernel1_naive);
      return;
    }
    case GemmKernel::tiled: {
      const dim3 grid(blocks_for(N, kTile, "N"), blocks_for(M, kTile, "M")), block(kTile, kTile);
      D2L_LAUNCH(matmul_kernel2_tiled, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row, b_col,
                                                                beta, C);
      D2L_CHECK_LAUNCH(matmul_kernel2_tiled);
      return;
    }
    case GemmKernel::regblock: {
      const dim3 grid(blocks_for(N, kBN, "N"), blocks_for(M, kBM, "M")), block(kRegThreads);
      D2L_LAUNCH(matmul_kernel3_regblock, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                   b_col, beta, C);
      D2L_CHECK_LAUNCH(matmul_kernel3_regblock);
      return;
    }
  }
  throw std::invalid_argument("gemm: unknown GemmKernel " + std::to_string(static_cast<int>(kernel)));
}

}  // namespace D2L_CUDA_NS
