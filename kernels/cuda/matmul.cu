// GEMM on the GPU: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major; the
// contract of kernels/cpu gemm (kernels/cpu/gemm.cpp is the CPU reference; tests compare them).
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)).
//
// The kernel family (pick one with GemmKernel; the framework's choice is made by the caller), numbered
// from the simplest on, as conv2d's family is numbered on its own (conv2d's kernel5 is its implicit GEMM):
//   kernel1 naive     one thread per element of C, a dot product straight from global memory:
//                     the simplest correct kernel; 2 global loads per multiply-add.
//   kernel2 tiled     a 16x16 block stages 16x16 tiles of op(A) and op(B) in shared memory (two
//                     __syncthreads per step: tile full / tile consumed): each global element is
//                     loaded by a block once instead of 16 times.
//   kernel3 regblock  a 256-thread block computes a 64x64 tile of C, each thread a 4x4 micro-tile
//                     held in registers, from 64x16 / 16x64 shared tiles: 8 shared loads feed 16
//                     multiply-adds (kernel2: 2 loads per multiply-add).
//   kernel4 warptiled a 256-thread block computes a 128x128 tile of C, each warp a 64x32 part of it,
//                     each thread an 8x8 tile in registers; the K slices (8 wide) are double-buffered
//                     in shared memory and loaded with float4 where the addresses allow: 16 shared
//                     loads (4 float4) feed 64 multiply-adds.
//   kernel5 tf32      kernel4's block and warp tiles on tensor cores (wmma, m16n16k8): operands rounded
//                     to TF32 (10-bit mantissa) in shared memory, FP32 accumulators; sm_80 and later.
//                     Faster, and less precise than FP32: within ~K 2^-11 sum |a| |b| of it.
//   kernel6 mma       TF32 through PTX below wmma (its own file, matmul_mma.cu): mma.sync m16n8k8 with
//                     the fragments in registers, ldmatrix, and a three-slice cp.async pipeline into
//                     swizzled shared memory; the same bound as kernel5.
//
// Transposes are strides: op(A)(i, k) = A[i * a_row + k * a_col], op(B)(k, j) = B[k * b_row + j * b_col].
// Sizes need not be multiples of the tiles: loads past an edge read 0, stores past it are skipped.
// Built twice (kernels/cuda/d2l_cuda.cuh): nvcc -> d2l::kernels::cuda, g++ + kernels/emu -> d2l::kernels::emu.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <cstdint>
#include <stdexcept>
#include <string>
#include <type_traits>

// kernel4's loops over its thread tile, unrolled: acc[m][n] indexed by constants only, so it stays
// in registers (nvcc: #pragma unroll; g++ for the emulation: #pragma GCC unroll).
#ifdef __CUDACC__
#define D2L_GEMM_UNROLL _Pragma("unroll")
#else
#define D2L_GEMM_UNROLL _Pragma("GCC unroll 8")
#endif

namespace D2L_CUDA_NS {

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

// ---- kernel4: grid (ceil(N/128), ceil(M/128)), block 256 (1-D: 8 warps). Three levels of tiling,
// each a part of the one above (kernel3 has the first and the last):
//
//   block tile   128 x 128 of C per block. K is walked in slices of kBK = 8: the block stages a
//                128 x 8 slice of op(A) and an 8 x 128 slice of op(B) in shared memory.
//   warp tile    64 x 32 of the block tile per warp: the 8 warps as 2 (down M) x 4 (along N).
//   thread tile  8 x 8 of the warp tile per thread, in registers. It is 2 x 2 fragments of 4 x 4,
//                one in each 32 x 16 quarter of the warp tile; inside a quarter the warp's 32 lanes
//                sit as 8 (down M) x 4 (along N), each on its 4 x 4 fragment.
//
//        block tile 128 x 128                 warp tile 64 x 32 (its 4 quarters)
//     +-------+-------+-------+-------+        +--------+--------+
//     | warp0 | warp1 | warp2 | warp3 |        | lanes  | lanes  |  each quarter 32 x 16:
//     |       |       |       |       |        | 8 x 4  | 8 x 4  |  lane (lm, ln) owns rows
//     +-------+-------+-------+-------+        +--------+--------+  4 lm .. 4 lm + 3 and columns
//     | warp4 | warp5 | warp6 | warp7 |        | lanes  | lanes  |  4 ln .. 4 ln + 3; a thread
//     |       |       |       |       |        | 8 x 4  | 8 x 4  |  tile = its fragment in all 4
//     +-------+-------+-------+-------+        +--------+--------+
//
// Per k of a slice a thread reads its 8 values of op(A) and 8 of op(B) from shared memory as four
// float4 and does their outer product: 64 multiply-adds (kernel3: 8 loads for 16). Why fragments in
// quarters rather than one 8 x 8 block per lane: the lanes of a float4 read then ask for 8 (op(A)) or
// 4 (op(B)) consecutive float4, shared by the lanes that need the same values: no bank conflicts.
// Why warps: a warp's lanes read only 64 + 32 distinct values of a k, each warp from its own rows
// and columns of the tiles.
//
// Double buffering: shared memory holds two slices of each operand. While the block computes on
// slice s (buffer s % 2), each thread's part of slice s + 1 is already on its way from global memory
// into registers (fetch); after the multiply-adds it is written to the other buffer (stash), and one
// __syncthreads per slice both publishes slice s + 1 and frees buffer s % 2 for slice s + 2.
//
// Loads: a slice of op(X) is stored S[k][m] (m: a row of op(A), or a column of op(B)). Each thread
// moves 4 values that are consecutive in X's memory: along k when X is stored with k contiguous (A
// not transposed, B transposed), then S gets them one by one down a column; else along m, written to
// S as one float4. They are one float4 global load when X's address is 16-byte aligned, its leading
// dimension a multiple of 4 and all 4 inside the matrix; else 4 scalar loads, 0 past the edges.
//
// Tile sizes. The constants below are sm_90's and every build uses them; the other rows are what we
// would set on those cards (any square block tile with whole float4 per thread fits the code). Measured on
// an H200 (sm_90; bench/README.md): 0.68x cuBLAS FP32 at 4096, 0.62-0.89x on ResNet-18's conv GEMMs. The
// sm_80 and sm_75 rows are not measured.
//   arch          block tile    threads  warp tile  thread tile  why
//                 BM x BN x BK
//   sm_90 (H100)  128 x 128 x 8 256      64 x 32    8 x 8        16 KiB of shared memory a block; at
//                                                                <= 128 registers a thread, 2 blocks (16
//                                                                warps) an SM. 132 SMs: a 4096^2 C is 1024
//                                                                blocks, a 1024^2 one only 64.
//   sm_80 (A100)  128 x 128 x 8 256      64 x 32    8 x 8        the same tiles; the stash would be
//                                                                cp.async (global -> shared memory without
//                                                                registers) over 3 or 4 slices in flight.
//   sm_75 (T4)    64 x 64 x 8   128      32 x 32    8 x 4        64 KiB of shared memory and 1024 threads
//                                                                an SM, 40 SMs: smaller blocks, more of
//                                                                them per SM and per GEMM.
namespace warptiled {
constexpr int kBM = 128, kBN = 128, kBK = 8;     // block tile of C; the K slice
constexpr int kWM = 64, kWN = 32;                // warp tile
constexpr int kTM = 8, kTN = 8;                  // thread tile
constexpr int kFM = 4, kFN = 4;                  // a fragment: one float4 of op(A) by one of op(B)
constexpr int kWarpsM = kBM / kWM, kWarpsN = kBN / kWN;  // 2 x 4 warps
constexpr int kThreads = kWarpsM * kWarpsN * 32;         // 256
constexpr int kFragsM = kTM / kFM, kFragsN = kTN / kFN;  // 2 x 2 fragments per thread
constexpr int kQuarterM = kWM / kFragsM, kQuarterN = kWN / kFragsN;  // 32 x 16: a fragment per lane
constexpr int kLanesM = kQuarterM / kFM, kLanesN = kQuarterN / kFN;  // 8 x 4 lanes
constexpr int kVecs = kBM * kBK / 4 / kThreads;  // float4 of a slice per thread and operand: 1
static_assert(kLanesM * kLanesN == 32, "a quarter of the warp tile is one fragment per lane");
static_assert(kFM == 4 && kFN == 4, "fragments are read from shared memory as float4");
static_assert(kBM == kBN, "one loader serves both operands: the slices of op(A) and op(B) have one shape");
static_assert(kBM * kBK % (4 * kThreads) == 0 && kBK % 4 == 0, "a slice is whole float4s, the same count per thread");

// The block's shared memory: two slices of each operand (buffers 0 and 1), 16-byte aligned for
// the float4 accesses.
struct alignas(16) Slices {
  float a[2][kBK][kBM];  // a[buf][k][m] = op(A)(row0 + m, k0 + k)
  float b[2][kBK][kBN];  // b[buf][k][n] = op(B)(k0 + k, col0 + n)
};

// X(m, k) = X[m * x_m + k * x_k], or 0 outside the M x K matrix.
__device__ __forceinline__ float at(const float* __restrict__ X, int64_t x_m, int64_t x_k, int64_t m, int64_t k,
                                    int64_t M, int64_t K) {
  return m < M && k < K ? X[m * x_m + k * x_k] : 0.0f;
}

// Where element group v of this thread lies in a slice: S[k .. k + 3][m] when k_contig (4
// consecutive k), else S[k][m .. m + 3].
struct Slot {
  int m, k;
};
__device__ __forceinline__ Slot slot(int v, bool k_contig) {
  const int e = static_cast<int>(threadIdx.x) + v * kThreads;
  if (k_contig) return {e / (kBK / 4), e % (kBK / 4) * 4};  // 2 threads per m: 32 consecutive bytes
  return {e % (kBM / 4) * 4, e / (kBM / 4)};                // 32 threads per k: 512 consecutive bytes
}

// The 4 values of X at (m, k .. k + 3) when k_contig, else at (m .. m + 3, k): one float4 load when
// `vec` allows it and all 4 are inside the M x K matrix, else 4 scalar loads, 0 past the edges.
__device__ __forceinline__ float4 load4(const float* __restrict__ X, int64_t x_m, int64_t x_k, bool k_contig, bool vec,
                                        int64_t m, int64_t k, int64_t M, int64_t K) {
  if (k_contig) {
    if (vec && m < M && k + 3 < K) return __ldg(reinterpret_cast<const float4*>(X + m * x_m + k));
    return make_float4(at(X, x_m, x_k, m, k, M, K), at(X, x_m, x_k, m, k + 1, M, K), at(X, x_m, x_k, m, k + 2, M, K),
                       at(X, x_m, x_k, m, k + 3, M, K));
  }
  if (vec && k < K && m + 3 < M) return __ldg(reinterpret_cast<const float4*>(X + k * x_k + m));
  return make_float4(at(X, x_m, x_k, m, k, M, K), at(X, x_m, x_k, m + 1, k, M, K), at(X, x_m, x_k, m + 2, k, M, K),
                     at(X, x_m, x_k, m + 3, k, M, K));
}

// fetch: this thread's share of the slice (m0, k0) of X, from global memory into registers.
__device__ __forceinline__ void fetch(float4 (&r)[kVecs], const float* __restrict__ X, int64_t x_m, int64_t x_k,
                                      bool k_contig, bool vec, int64_t m0, int64_t M, int64_t k0, int64_t K) {
  for (int v = 0; v < kVecs; ++v) {
    const Slot s = slot(v, k_contig);
    r[v] = load4(X, x_m, x_k, k_contig, vec, m0 + s.m, k0 + s.k, M, K);
  }
}

// stash: the fetched registers into one buffer of the slice in shared memory.
__device__ __forceinline__ void stash(float (&S)[kBK][kBM], const float4 (&r)[kVecs], bool k_contig) {
  for (int v = 0; v < kVecs; ++v) {
    const Slot s = slot(v, k_contig);
    if (k_contig) {  // 4 consecutive k: down a column of S
      S[s.k][s.m] = r[v].x;
      S[s.k + 1][s.m] = r[v].y;
      S[s.k + 2][s.m] = r[v].z;
      S[s.k + 3][s.m] = r[v].w;
    } else {
      *reinterpret_cast<float4*>(&S[s.k][s.m]) = r[v];
    }
  }
}

// C[i][j .. j + 3] = alpha * acc + beta * C (C not read when beta == 0), skipping columns past N;
// one float4 store when `vec` (C 16-byte aligned, N a multiple of 4) and all 4 are inside.
__device__ __forceinline__ void store4(float* __restrict__ C, int64_t N, int64_t i, int64_t j, float4 acc,
                                       float alpha, float beta, bool vec) {
  if (j >= N) return;
  float* c = C + i * N + j;
  if (vec && j + 3 < N) {
    float4 out = make_float4(alpha * acc.x, alpha * acc.y, alpha * acc.z, alpha * acc.w);
    if (beta != 0.0f) {
      const float4 old = *reinterpret_cast<const float4*>(c);
      out = make_float4(out.x + beta * old.x, out.y + beta * old.y, out.z + beta * old.z, out.w + beta * old.w);
    }
    *reinterpret_cast<float4*>(c) = out;
  } else {
    const float v[4] = {acc.x, acc.y, acc.z, acc.w};
    for (int n = 0; n < 4 && j + n < N; ++n) gemm_store(c + n, alpha, v[n], beta);
  }
}

// a_vec, b_vec: float4 loads allowed for A, B (16-byte aligned, leading dimension a multiple of 4);
// c_vec the same for C's stores.
__global__ void matmul_kernel4_warptiled(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                         int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                         int64_t b_col, float beta, float* __restrict__ C, bool ta, bool tb,
                                         bool a_vec, bool b_vec, bool c_vec) {
  D2L_SHARED(Slices, smem, [1]);
  Slices& s = smem[0];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t row0 = int64_t(blockIdx.y) * kBM, col0 = int64_t(blockIdx.x) * kBN;  // block tile in C
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;                    // warp tile in the block tile
  const int lm = lane / kLanesN * kFM, ln = lane % kLanesN * kFN;                    // fragment in a quarter
  // op(A) as X(m, k) with m a row of C; op(B) as X(m, k) with m a column of C.
  const bool a_kc = !ta, b_kc = tb;  // which of them is stored with k contiguous
  float4 a_next[kVecs], b_next[kVecs];
  float acc[kTM][kTN] = {};
  const int64_t slices = (K + kBK - 1) / kBK;
  if (slices > 0) {  // slice 0 into buffer 0
    fetch(a_next, A, a_row, a_col, a_kc, a_vec, row0, M, 0, K);
    fetch(b_next, B, b_col, b_row, b_kc, b_vec, col0, N, 0, K);
    stash(s.a[0], a_next, a_kc);
    stash(s.b[0], b_next, b_kc);
    __syncthreads();
  }
  for (int64_t sl = 0; sl < slices; ++sl) {
    const int cur = static_cast<int>(sl % 2);
    const bool more = sl + 1 < slices;
    if (more) {  // slice sl + 1 on its way into registers while this one is computed on
      fetch(a_next, A, a_row, a_col, a_kc, a_vec, row0, M, (sl + 1) * kBK, K);
      fetch(b_next, B, b_col, b_row, b_kc, b_vec, col0, N, (sl + 1) * kBK, K);
    }
    D2L_GEMM_UNROLL
    for (int k = 0; k < kBK; ++k) {
      float a[kTM], b[kTN];  // this thread's column of op(A) and row of op(B), 2 fragments each
      D2L_GEMM_UNROLL
      for (int f = 0; f < kFragsM; ++f) {
        const float4 v = *reinterpret_cast<const float4*>(&s.a[cur][k][wm + f * kQuarterM + lm]);
        a[f * kFM] = v.x, a[f * kFM + 1] = v.y, a[f * kFM + 2] = v.z, a[f * kFM + 3] = v.w;
      }
      D2L_GEMM_UNROLL
      for (int f = 0; f < kFragsN; ++f) {
        const float4 v = *reinterpret_cast<const float4*>(&s.b[cur][k][wn + f * kQuarterN + ln]);
        b[f * kFN] = v.x, b[f * kFN + 1] = v.y, b[f * kFN + 2] = v.z, b[f * kFN + 3] = v.w;
      }
      D2L_GEMM_UNROLL
      for (int m = 0; m < kTM; ++m) {
        D2L_GEMM_UNROLL
        for (int n = 0; n < kTN; ++n) acc[m][n] += a[m] * b[n];  // outer product: 64 FMAs
      }
    }
    if (more) {  // into the other buffer: nobody reads it since the last barrier
      stash(s.a[cur ^ 1], a_next, a_kc);
      stash(s.b[cur ^ 1], b_next, b_kc);
    }
    __syncthreads();  // slice sl + 1 complete, and slice sl consumed, for everyone
  }
  // acc[m][n] is C at row wm + (m / kFM) * kQuarterM + lm + m % kFM, column likewise along N.
  D2L_GEMM_UNROLL
  for (int m = 0; m < kTM; ++m) {
    const int64_t i = row0 + wm + m / kFM * kQuarterM + lm + m % kFM;
    if (i >= M) continue;
    D2L_GEMM_UNROLL
    for (int f = 0; f < kFragsN; ++f) {
      const float4 v = make_float4(acc[m][f * kFN], acc[m][f * kFN + 1], acc[m][f * kFN + 2], acc[m][f * kFN + 3]);
      store4(C, N, i, col0 + wn + f * kQuarterN + ln, v, alpha, beta, c_vec);
    }
  }
}
}  // namespace warptiled
using warptiled::matmul_kernel4_warptiled;

// ---- kernel5: grid (ceil(N/128), ceil(M/128)), block 256 (1-D: 8 warps). Tensor cores through the warp
// matrix API (wmma), TF32 inputs, FP32 accumulation. The tiling is kernel4's with the thread level
// replaced by the tensor core's own:
//
//   block tile   128 x 128 of C per block; K walked in slices of kBK = 16, staged in shared memory
//                (op(A): 128 x 16, op(B): 16 x 128), double-buffered with the next slice's fetch into
//                registers as in kernel4.
//   warp tile    64 x 32 of the block tile per warp, the 8 warps as 2 (down M) x 4 (along N).
//   fragment     16 x 16 of C: a warp tile is 4 x 2 accumulator fragments. Per 8-wide step of K the
//                warp loads 4 fragments of op(A) (16 x 8) and 2 of op(B) (8 x 16) and issues 8
//                mma_sync (m16n16k8): 6 fragment loads feed 8 tensor-core products.
//
//        block tile 128 x 128                 warp tile 64 x 32: 4 x 2 fragments
//     +-------+-------+-------+-------+        +--------+--------+
//     | warp0 | warp1 | warp2 | warp3 |        | acc 0  | acc 1  |   acc f = op(A) fragment f / 2
//     |       |       |       |       |        +--------+--------+        @ op(B) fragment f % 2
//     +-------+-------+-------+-------+        |   ...  |   ...  |
//     | warp4 | warp5 | warp6 | warp7 |        +--------+--------+
//     |       |       |       |       |        | acc 6  | acc 7  |
//     +-------+-------+-------+-------+        +--------+--------+
//
// TF32 (sm_80 and later): 1 sign bit, FP32's 8 exponent bits and 10 mantissa bits (FP32 has 23): FP32's
// range, a relative precision of 2^-11 after rounding. The tensor core multiplies TF32 values and
// adds the products in FP32. An FP32 input is rounded to the nearest TF32 (ties away from zero,
// __float_to_tf32) when it is stored to shared memory: once per element, not once per fragment load.
// Left unrounded, the tensor core would just drop the 13 low bits (truncation: twice the error, and
// biased). Error bound of one element: |C - C_exact| <~ (K + 2) 2^-11 sum_k |op(A)(i, k)| |op(B)(k, j)|
// (2 roundings of 2^-11 per product, then FP32 sums), about 1000x FP32's: what --gemm tf32 trades for speed.
//
// Shared memory. A slice of op(X) sits in shared memory as the wmma fragment layout that matches
// its global memory, so that each thread's 4 consecutive global values are one float4 store:
//   k contiguous in X (A not transposed, B transposed):  S[m][k], rows of kLdK = 16 + 4 floats;
//                                                        op(A) fragments row_major, op(B) col_major
//   m contiguous in X (A transposed, B not transposed):  S[k][m], rows of kLdM = 128 + 8 floats;
//                                                        op(A) fragments col_major, op(B) row_major
// so the kernel is a template over the two choices (4 instances). The padding: wmma wants ldm a
// multiple of 4 floats and each fragment's first element 32-byte aligned; its TF32 loads read, in
// each instruction, 8 rows (or columns) of 4 consecutive values, which without padding would hit the
// same banks (row strides of 16 or 128 floats are multiples of 32 banks). With 20 the 8 rows start at
// banks 0, 20, 8, 28, 16, 4, 24, 12; with 136, at 0, 8, 16, 24: the 32 reads fall in 32 banks.
// Two slices of both operands take 40 KiB; after the last slice the same memory holds each warp's
// 16 x 16 staging tile for the epilogue.
//
// Epilogue: an accumulator's elements sit in lanes in an order CUDA leaves unspecified, so each
// fragment goes through shared memory (store_matrix_sync into the warp's staging tile), and each
// lane then writes 8 of its elements as alpha * acc + beta * C, skipping those past M or N (C not
// read when beta == 0).
//
// Tile sizes. The constants are sm_90's and every build uses them (the emulation's 48 KiB of shared
// memory a block is also CUDA's limit without opting in). Measured on an H200 (sm_90; bench/README.md):
// 0.16x cuBLAS with TF32 at 4096. Each 8-deep k-step loads every fragment from shared memory again
// (load_matrix_sync), so shared-memory traffic, not the tensor cores, bounds it, as Nsight Compute shows
// for conv2d's kernel5 (conv2d_implicit.cu) in TF32, which is built the same way.
//   arch          block tile      threads  warp tile  fragments  why
//                 BM x BN x BK
//   sm_90 (H100)  128 x 128 x 16  256      64 x 32    4 x 2      40 KiB of shared memory, ~128 registers a
//                                                                thread (64 of them accumulators): 2 blocks
//                                                                an SM. Hopper's own path (wgmma, TMA) is
//                                                                not reachable through wmma.
//   sm_80 (A100)  128 x 128 x 32  256      64 x 32    4 x 2      a longer slice with cp.async (global ->
//                                                                shared memory without registers) over 3
//                                                                slices in flight, in dynamic shared memory
//                                                                past 48 KiB (cudaFuncSetAttribute).
//   sm_75 (T4)    no TF32: Turing's tensor cores take FP16 (or INT8) inputs. The kernel compiles to an
//                 empty body there and the launcher refuses devices below compute capability 8.0.
namespace tf32 {
constexpr int kBM = 128, kBN = 128, kBK = 16;  // block tile of C; the K slice
constexpr int kWM = 64, kWN = 32;              // warp tile
constexpr int kF = 16, kStep = 8;              // a fragment of C is 16 x 16; an mma_sync covers 8 of K
constexpr int kWarpsM = kBM / kWM, kWarpsN = kBN / kWN;  // 2 x 4 warps
constexpr int kThreads = kWarpsM * kWarpsN * 32;         // 256
constexpr int kFragsM = kWM / kF, kFragsN = kWN / kF;    // 4 x 2 accumulators per warp
constexpr int kFrags = kFragsM * kFragsN;
constexpr int kLdK = kBK + 4, kLdM = kBM + 8;  // padded rows of S[m][k] and of S[k][m]
constexpr int kSlice = kBM * kLdK > kBK * kLdM ? kBM * kLdK : kBK * kLdM;  // floats of a slice, either layout
constexpr int kStageLd = kF + 4;                                          // the epilogue's staging tile
constexpr int kVecs = kBM * kBK / 4 / kThreads;  // float4 of a slice per thread and operand: 2
static_assert(kBM == kBN, "one loader serves both operands: the slices of op(A) and op(B) have one shape");
static_assert(kBM * kBK % (4 * kThreads) == 0 && kBK % kStep == 0, "whole float4s per thread, whole mma steps");
static_assert(kLdK % 4 == 0 && kLdM % 4 == 0 && kStageLd % 4 == 0, "wmma's ldm: a multiple of 4 floats");
static_assert(kF * kLdK % 8 == 0 && kStep * kLdM % 8 == 0 && kSlice % 8 == 0, "fragments start 32-byte aligned");
static_assert(kThreads / 32 * kF * kStageLd <= 4 * kSlice, "the staging tiles fit in the slices' memory");

struct alignas(128) Slices {
  float a[2][kSlice];  // op(A)(row0 + m, k0 + k) at index(a_kc, m, k)
  float b[2][kSlice];  // op(B)(k0 + k, col0 + n) at index(b_kc, n, k)
};

// Where X(m, k) of a slice sits in shared memory: S[m][k] when k is contiguous in X, else S[k][m].
__device__ __forceinline__ int index(bool k_contig, int m, int k) { return k_contig ? m * kLdK + k : k * kLdM + m; }

// fetch: this thread's share of the slice (m0, k0) of X into registers; kernel4's, with 16-wide slices.
// Group v of this thread: 4 consecutive k at one m when k_contig, else 4 consecutive m at one k.
__device__ __forceinline__ void slot(int v, bool k_contig, int& m, int& k) {
  const int e = static_cast<int>(threadIdx.x) + v * kThreads;
  if (k_contig) m = e / (kBK / 4), k = e % (kBK / 4) * 4;  // 4 threads per m: 64 consecutive bytes
  else m = e % (kBM / 4) * 4, k = e / (kBM / 4);           // 32 threads per k: 512 consecutive bytes
}
__device__ __forceinline__ void fetch(float4 (&r)[kVecs], const float* __restrict__ X, int64_t x_m, int64_t x_k,
                                      bool k_contig, bool vec, int64_t m0, int64_t M, int64_t k0, int64_t K) {
  for (int v = 0; v < kVecs; ++v) {
    int sm, sk;
    slot(v, k_contig, sm, sk);
    r[v] = warptiled::load4(X, x_m, x_k, k_contig, vec, m0 + sm, k0 + sk, M, K);
  }
}

// stash: the fetched registers, rounded to TF32, into one buffer of the slice: one float4 store each
// (the 4 values are consecutive in S as in X).
__device__ __forceinline__ void stash(float* S, const float4 (&r)[kVecs], bool k_contig) {
  for (int v = 0; v < kVecs; ++v) {
    int m, k;
    slot(v, k_contig, m, k);
    *reinterpret_cast<float4*>(S + index(k_contig, m, k)) =
        make_float4(to_tf32(r[v].x), to_tf32(r[v].y), to_tf32(r[v].z),
                    to_tf32(r[v].w));
  }
}

// A_KC, B_KC: op(A), op(B) stored with k contiguous (not ta; tb), which fixes the slices' layouts and
// so the fragments' (see above). a_vec, b_vec: float4 loads allowed (as kernel4).
template <bool A_KC, bool B_KC>
__launch_bounds__(kThreads, 2)  // at most 128 registers a thread: 2 blocks an SM
__global__ void matmul_kernel5_tf32(int64_t M, int64_t N, int64_t K, float alpha, const float* __restrict__ A,
                                    int64_t a_row, int64_t a_col, const float* __restrict__ B, int64_t b_row,
                                    int64_t b_col, float beta, float* __restrict__ C, bool a_vec, bool b_vec) {
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800  // TF32 tensor cores: sm_80 and later (the launcher checks)
  using LayoutA = std::conditional_t<A_KC, wmma::row_major, wmma::col_major>;
  using LayoutB = std::conditional_t<B_KC, wmma::col_major, wmma::row_major>;
  constexpr unsigned lda = A_KC ? kLdK : kLdM, ldb = B_KC ? kLdK : kLdM;
  D2L_SHARED(Slices, smem, [1]);
  Slices& s = smem[0];
  const int t = threadIdx.x, warp = t / 32, lane = t % 32;
  const int64_t row0 = int64_t(blockIdx.y) * kBM, col0 = int64_t(blockIdx.x) * kBN;  // block tile in C
  const int wm = warp / kWarpsN * kWM, wn = warp % kWarpsN * kWN;                    // warp tile in the block tile
  float4 a_next[kVecs], b_next[kVecs];
  wmma::fragment<wmma::accumulator, kF, kF, kStep, float> acc[kFrags];
  D2L_GEMM_UNROLL
  for (int f = 0; f < kFrags; ++f) wmma::fill_fragment(acc[f], 0.0f);
  const int64_t slices = (K + kBK - 1) / kBK;
  if (slices > 0) {  // slice 0 into buffer 0
    fetch(a_next, A, a_row, a_col, A_KC, a_vec, row0, M, 0, K);
    fetch(b_next, B, b_col, b_row, B_KC, b_vec, col0, N, 0, K);
    stash(s.a[0], a_next, A_KC);
    stash(s.b[0], b_next, B_KC);
    __syncthreads();
  }
  for (int64_t sl = 0; sl < slices; ++sl) {
    const int cur = static_cast<int>(sl & 1);  // the buffer of slice sl
    const bool more = sl + 1 < slices;
    if (more) {  // slice sl + 1 on its way into registers while this one is computed on
      fetch(a_next, A, a_row, a_col, A_KC, a_vec, row0, M, (sl + 1) * kBK, K);
      fetch(b_next, B, b_col, b_row, B_KC, b_vec, col0, N, (sl + 1) * kBK, K);
    }
    D2L_GEMM_UNROLL
    for (int k = 0; k < kBK; k += kStep) {
      wmma::fragment<wmma::matrix_a, kF, kF, kStep, wmma::precision::tf32, LayoutA> a[kFragsM];
      wmma::fragment<wmma::matrix_b, kF, kF, kStep, wmma::precision::tf32, LayoutB> b[kFragsN];
      D2L_GEMM_UNROLL
      for (int i = 0; i < kFragsM; ++i) wmma::load_matrix_sync(a[i], s.a[cur] + index(A_KC, wm + i * kF, k), lda);
      D2L_GEMM_UNROLL
      for (int j = 0; j < kFragsN; ++j) wmma::load_matrix_sync(b[j], s.b[cur] + index(B_KC, wn + j * kF, k), ldb);
      // Already TF32 (stash rounded them): no conversion loop over the fragments' elements.
      D2L_GEMM_UNROLL
      for (int f = 0; f < kFrags; ++f) wmma::mma_sync(acc[f], a[f / kFragsN], b[f % kFragsN], acc[f]);
    }
    if (more) {  // into the other buffer: nobody reads it since the last barrier
      stash(s.a[cur ^ 1], a_next, A_KC);
      stash(s.b[cur ^ 1], b_next, B_KC);
    }
    __syncthreads();  // slice sl + 1 complete, and slice sl consumed, for everyone
  }
  // Epilogue: after the last barrier the slices are free; warp w stages its fragments at w's tile.
  float* stage = &s.a[0][0] + warp * kF * kStageLd;
  D2L_GEMM_UNROLL  // acc[f] by constants only: in registers, not in local memory
  for (int f = 0; f < kFrags; ++f) {
    wmma::store_matrix_sync(stage, acc[f], kStageLd, wmma::mem_row_major);
    __syncwarp();  // the tile complete before lanes read each other's elements
    const int64_t i0 = row0 + wm + f / kFragsN * kF, j0 = col0 + wn + f % kFragsN * kF;
    for (int e = lane; e < kF * kF; e += 32) {  // 2 rows of 16 a pass: 64-byte runs of C
      const int r = e / kF, c = e % kF;
      const int64_t i = i0 + r, j = j0 + c;
      if (i < M && j < N) gemm_store(&C[i * N + j], alpha, stage[r * kStageLd + c], beta);
    }
    __syncwarp();  // read before the next fragment overwrites the tile
  }
#endif
}

using Kernel = void (*)(int64_t, int64_t, int64_t, float, const float*, int64_t, int64_t, const float*, int64_t,
                        int64_t, float, float*, bool, bool);
inline Kernel instance(bool a_kc, bool b_kc) {
  if (a_kc) return b_kc ? matmul_kernel5_tf32<true, true> : matmul_kernel5_tf32<true, false>;
  return b_kc ? matmul_kernel5_tf32<false, true> : matmul_kernel5_tf32<false, false>;
}
}  // namespace tf32

// ---- TF32's availability and --precision's rule (kernels.hpp)
bool device_has_tf32() {
#ifdef __CUDACC__
  int device = 0, major = 0;
  if (cudaGetDevice(&device) != cudaSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
    return false;
  return major >= 8;
#else
  return true;
#endif
}

bool uses_tf32() {
  using ::d2l::kernels::cpu::Precision;
  const Precision p = ::d2l::kernels::cpu::precision();
#ifdef __CUDACC__
  return p != Precision::fp32 && device_has_tf32();
#else
  return p == Precision::tf32;  // automatic is fp32 under the emulation
#endif
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
    case GemmKernel::warptiled: {
      namespace wt = warptiled;
      // float4 loads need a 16-byte aligned base and a leading dimension (the stride between the rows of
      // the stored matrix) that is a multiple of 4 floats: then every 4th element is aligned too.
      auto vec = [](const float* p, int64_t ld) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 4 == 0; };
      const bool a_vec = vec(A, ta ? M : K), b_vec = vec(B, tb ? K : N), c_vec = vec(C, N);
      const dim3 grid(blocks_for(N, wt::kBN, "N"), blocks_for(M, wt::kBM, "M")), block(wt::kThreads);
      D2L_LAUNCH(matmul_kernel4_warptiled, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row,
                                                                    b_col, beta, C, ta, tb, a_vec, b_vec, c_vec);
      D2L_CHECK_LAUNCH(matmul_kernel4_warptiled);
      return;
    }
    case GemmKernel::tf32: {
      // TF32 tensor cores from compute capability 8.0 (sm_80): older devices would run the empty body.
      if (!device_has_tf32())
        throw std::invalid_argument("gemm: GemmKernel::tf32 needs TF32 tensor cores (compute capability 8.0 or later)");
      auto vec = [](const float* p, int64_t ld) { return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % 4 == 0; };
      const bool a_vec = vec(A, ta ? M : K), b_vec = vec(B, tb ? K : N);
      const dim3 grid(blocks_for(N, tf32::kBN, "N"), blocks_for(M, tf32::kBM, "M")), block(tf32::kThreads);
      const tf32::Kernel matmul_kernel5_tf32 = tf32::instance(!ta, tb);  // k contiguous in A, in B
      D2L_LAUNCH(matmul_kernel5_tf32, grid, block, 0, stream)(M, N, K, alpha, A, a_row, a_col, B, b_row, b_col, beta,
                                                               C, a_vec, b_vec);
      D2L_CHECK_LAUNCH(matmul_kernel5_tf32);
      return;
    }
    case GemmKernel::mma:
      return gemm_mma(stream, ta, tb, M, N, K, alpha, A, B, beta, C);
  }
  throw std::invalid_argument("gemm: unknown GemmKernel " + std::to_string(static_cast<int>(kernel)));
}

}  // namespace D2L_CUDA_NS
