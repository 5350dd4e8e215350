// The 16-bit GEMM on the GPU: C (M, N) float32 = alpha * op(A) @ op(B) + beta * C, A and B bfloat16
// or float16, sums in float32 (the contract of kernels/cpu gemm16, its reference). matmul.cu's kernel2
// with 16-bit operands: a 16 x 16 block stages 16 x 16 tiles of op(A) and op(B) in shared memory,
// widened to float32 as they are loaded (exact), and each thread sums its element of C in float32.
// Transposes are strides, as in matmul.cu.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/float16.cuh"

#include <stdexcept>
#include <string>

namespace D2L_CUDA_NS {

constexpr int kTile16 = 16;

// grid (ceil(N/16), ceil(M/16)), block (16, 16); thread (ty, tx) owns C[i][j].
template <class Widen>
__global__ void matmul16_kernel2_tiled(int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* __restrict__ A,
                                       int64_t a_row, int64_t a_col, const uint16_t* __restrict__ B, int64_t b_row,
                                       int64_t b_col, float beta, float* __restrict__ C) {
  D2L_SHARED(float, As, [kTile16][kTile16]);  // As[r][k] = op(A)(row0 + r, k0 + k), widened
  D2L_SHARED(float, Bs, [kTile16][kTile16]);  // Bs[k][c] = op(B)(k0 + k, col0 + c), widened
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t i = int64_t(blockIdx.y) * kTile16 + ty, j = int64_t(blockIdx.x) * kTile16 + tx;
  const Widen widen;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += kTile16) {
    // Every thread loads (zeros past the edges) and reaches both barriers, even outside C.
    As[ty][tx] = (i < M && k0 + tx < K) ? widen(A[i * a_row + (k0 + tx) * a_col]) : 0.0f;
    Bs[ty][tx] = (k0 + ty < K && j < N) ? widen(B[(k0 + ty) * b_row + j * b_col]) : 0.0f;
    __syncthreads();
    for (int k = 0; k < kTile16; ++k) acc += As[ty][k] * Bs[k][tx];
    __syncthreads();
  }
  if (i < M && j < N) gemm_store(&C[i * N + j], alpha, acc, beta);
}

void gemm16(Stream stream, GemmKernel kernel, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
            const uint16_t* A, const uint16_t* B, float beta, float* C) {
  if (kernel == GemmKernel::mma) return gemm16_mma(stream, f, ta, tb, M, N, K, alpha, A, B, beta, C);
  if (M <= 0 || N <= 0) return;
  if ((N + kTile16 - 1) / kTile16 > 2147483647 || (M + kTile16 - 1) / kTile16 > 65535)
    throw std::invalid_argument("gemm16: M = " + std::to_string(M) + " too large for one grid");
  const int64_t a_row = ta ? 1 : K, a_col = ta ? M : 1;  // A stored (K, M) when ta, else (M, K)
  const int64_t b_row = tb ? 1 : N, b_col = tb ? K : 1;  // B stored (N, K) when tb, else (K, N)
  const dim3 grid(unsigned((N + kTile16 - 1) / kTile16), unsigned((M + kTile16 - 1) / kTile16)), block(kTile16, kTile16);
  if (f == Float16::bf16) {
    D2L_LAUNCH(matmul16_kernel2_tiled<FromBf16>, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                          b_col, beta, C);
    D2L_CHECK_LAUNCH(matmul16_kernel2_tiled<FromBf16>);
  } else {
    D2L_LAUNCH(matmul16_kernel2_tiled<FromF16>, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                         b_col, beta, C);
    D2L_CHECK_LAUNCH(matmul16_kernel2_tiled<FromF16>);
  }
}

}  // namespace D2L_CUDA_NS
