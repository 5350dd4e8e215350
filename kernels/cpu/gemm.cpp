// gemm: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, all row-major.
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)). The family:
//   kernel1 gemm_naive    the three loops of the definition: the reference, read it first
//   kernel2 gemm_blocked  the same sum in an order the caches like (i-k-j, blocks of B kept in cache)
//   kernel3 gemm_packed   Goto/BLIS: packed panels and a register micro-kernel (gemm_packed.cpp)
//   gemm_openblas         OpenBLAS's sgemm, the library member and reference
//   gemm                  the member chosen (--gemm), or automatic's per shape: what every op calls
// tests/test_gemm.cpp checks every member against a double-precision product and against kernel1.
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <stdexcept>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

// ---- kernel1: C[i][j] = alpha * sum over k of op(A)[i][k] * op(B)[k][j] + beta * C[i][j]. Threads
// take whole rows of C. (beta == 0 overwrites C, as BLAS does, whatever C held.)
void gemm_naive(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                const float* B, float beta, float* C) {
  c.parallel_for(M, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k) acc += (ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
        C[i * N + j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * C[i * N + j]);
      }
  });
}

// ---- kernel2: kernel1's inner loop walks down a column of op(B), N floats apart: a new cache line
// each step. Exchanging the two inner loops (i, k, j) makes the innermost loop run along a row of
// op(B) and a row of C's accumulators, contiguous, which the compiler vectorises. Blocking keeps a
// KB x NB block of op(B) (256 KiB) in L2 while the MB rows of a block of A pass over it; each row
// accumulates its NB columns in acc, so that C is written once, as alpha * sum + beta * C. A
// transposed B (stored (N, K)) has op(B)'s rows down its columns: its block is first copied, turned,
// into a row-major buffer. Each value is still one sum in k's order. Threads take blocks of MB rows.
constexpr int64_t kMB = 64, kNB = 256, kKB = 256;

// row[0..n) += a * b[0..n): the innermost loop, in pieces of 8 that the compiler turns into vector
// instructions (at -O2 it vectorises only loops of known length), then the rest one by one.
static inline void row_axpy(float a, const float* __restrict b, float* __restrict row, int64_t n) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int u = 0; u < 8; ++u) row[j + u] += a * b[j + u];
  for (; j < n; ++j) row[j] += a * b[j];
}

void gemm_blocked(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  const float* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  if (K <= 0) return gemm_scale(c, M * N, beta, C);
  c.parallel_for((M + kMB - 1) / kMB, [&](int64_t begin, int64_t end) {
    Scratch<float> acc_buf(c.workspace, kMB * kNB), turned(c.workspace, tb ? kKB * kNB : 0);
    float* acc = acc_buf.data();
    for (int64_t ib = begin; ib < end; ++ib) {
      const int64_t i0 = ib * kMB, mb = std::min(kMB, M - i0);
      for (int64_t j0 = 0; j0 < N; j0 += kNB) {
        const int64_t nb = std::min(kNB, N - j0);
        std::fill(acc, acc + mb * nb, 0.0f);
        for (int64_t k0 = 0; k0 < K; k0 += kKB) {
          const int64_t kb = std::min(kKB, K - k0);
          const float* block = B + k0 * N + j0;  // op(B)[k0.., j0..], rows `ld` floats apart
          int64_t ld = N;
          if (tb) {  // turned[k][j] = B[j0 + j][k0 + k]
            for (int64_t j = 0; j < nb; ++j)
              for (int64_t k = 0; k < kb; ++k) turned.data()[k * nb + j] = B[(j0 + j) * K + k0 + k];
            block = turned.data(), ld = nb;
          }
          for (int64_t i = 0; i < mb; ++i) {
            float* row = acc + i * nb;
            for (int64_t k = 0; k < kb; ++k) {
              const float a = ta ? A[(k0 + k) * M + i0 + i] : A[(i0 + i) * K + k0 + k];
              row_axpy(a, block + k * ld, row, nb);
            }
          }
        }
        for (int64_t i = 0; i < mb; ++i)
          for (int64_t j = 0; j < nb; ++j) {
            float& out = C[(i0 + i) * N + j0 + j];
            out = alpha * acc[i * nb + j] + (beta == 0.0f ? 0.0f : beta * out);
          }
      }
    }
  });
}

void gemm_scale(const Ctx& c, int64_t n, float beta, float* C) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];  // beta == 0 overwrites, even NaN
  });
}

// ---- the OpenBLAS member

// The project links the pthreads OpenBLAS, pinned to one thread per call (blas_check.cpp): device
// threads then run their sgemm calls at the same time, safely. Debian's serial build has no locking
// in its buffer pool (concurrent calls give rare wrong results); if the serial build is the one
// loaded (Debian's alternatives), calls are serialised: correct, but without overlap.
static std::mutex blas_mutex;
#define cblas_sgemm(...)                                                        \
  do {                                                                          \
    std::unique_lock<std::mutex> blas_lock(blas_mutex, std::defer_lock);        \
    if (blas_serialised()) blas_lock.lock();                                    \
    ::cblas_sgemm(__VA_ARGS__);                                                 \
  } while (0)

void gemm_openblas(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   const float* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  check_blas();  // once: pins the threaded build to 1 thread per call (devices call it first anyway)
  if (K <= 0) return gemm_scale(c, M * N, beta, C);
  const auto opA = ta ? CblasTrans : CblasNoTrans, opB = tb ? CblasTrans : CblasNoTrans;
  const int64_t lda = ta ? M : K, ldb = tb ? K : N, ldc = N;  // leading dimensions as stored

  // Each device thread makes one 1-thread OpenBLAS call on its own contiguous block of C: rows
  // [b, e) normally, columns [b, e) when there are too few rows to share out. Note: OpenBLAS may
  // order the K-sum differently at block edges, so C is not guaranteed bitwise identical for a
  // different thread count (only within rounding); every other CPU kernel is thread-invariant.
  const bool split_rows = M >= 4 * static_cast<int64_t>(c.threads) || M >= N;
  if (split_rows) {
    c.parallel_for(M, [&](int64_t b, int64_t e) {
      const float* Ab = ta ? A + b : A + b * K;  // row b of op(A)
      cblas_sgemm(CblasRowMajor, opA, opB, e - b, N, K, alpha, Ab, lda, B, ldb, beta, C + b * ldc, ldc);
    });
  } else {
    c.parallel_for(N, [&](int64_t b, int64_t e) {
      const float* Bb = tb ? B + b * K : B + b;  // column b of op(B)
      cblas_sgemm(CblasRowMajor, opA, opB, M, e - b, K, alpha, A, lda, Bb, ldb, beta, C + b, ldc);
    });
  }
}

// ======== the choice: one place ========

static std::atomic<GemmKernel> g_gemm_kernel{GemmKernel::automatic};
void set_gemm_kernel(GemmKernel k) { g_gemm_kernel.store(k, std::memory_order_relaxed); }
GemmKernel gemm_kernel() { return g_gemm_kernel.load(std::memory_order_relaxed); }

// automatic's rule, from bench/gemm_bench's tables (bench/README.md, "The CPU GEMM family"): kernel3
// on every shape, the fastest of our members on each shape measured. OpenBLAS is left out even where
// it is faster (products of a few MFLOP, when it recognises the CPU): no figure should depend on its
// guess of the CPU.
GemmKernel gemm_auto_kernel(int64_t M, int64_t N, int64_t K) {
  (void)M, (void)N, (void)K;
  return GemmKernel::packed;
}

static constexpr const char* kGemmNames[] = {"naive", "blocked", "packed", "openblas", "auto"};
const char* gemm_kernel_name(GemmKernel k) { return kGemmNames[static_cast<int>(k)]; }
GemmKernel gemm_kernel_from_name(const char* name) {
  for (int i = 0; i < 5; ++i)
    if (std::string(name) == kGemmNames[i]) return static_cast<GemmKernel>(i);
  throw std::invalid_argument(std::string("unknown CPU GEMM '") + name + "'");
}

int gemm_vector_floats() {
  switch (gemm_kernel()) {
    case GemmKernel::openblas: return blas_vector_floats();
    case GemmKernel::naive:
    case GemmKernel::blocked: return 4;  // what the compiler makes of them: SSE
    default: return vector_isa_floats(gemm_isa());
  }
}

std::string gemm_description() {
  const GemmKernel k = gemm_kernel();
  std::string d = std::string("CPU GEMM: ") + gemm_kernel_name(k);
  if (k == GemmKernel::openblas) return d + " (its " + blas_core_name() + " kernels)";
  if (k == GemmKernel::naive || k == GemmKernel::blocked) return d + " (scalar code, as the compiler vectorises it)";
  if (k == GemmKernel::automatic) d += " (kernel3 packed)";
  return d + ", " + vector_isa_name(gemm_isa());
}

void gemm(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  GemmKernel k = gemm_kernel();
  if (k == GemmKernel::automatic) k = gemm_auto_kernel(M, N, K);
  switch (k) {
    case GemmKernel::naive: return gemm_naive(c, ta, tb, M, N, K, alpha, A, B, beta, C);
    case GemmKernel::blocked: return gemm_blocked(c, ta, tb, M, N, K, alpha, A, B, beta, C);
    case GemmKernel::openblas: return gemm_openblas(c, ta, tb, M, N, K, alpha, A, B, beta, C);
    default: return gemm_packed(c, ta, tb, M, N, K, alpha, A, B, beta, C);
  }
}

}  // namespace d2l::kernels::cpu
