// gemm: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, all row-major.
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)).
//   kernel1 gemm_naive  the three loops of the definition: the reference, read it first
//   gemm                OpenBLAS's sgemm, one call per device thread on its block of C (the one ops use)
// tests/test_gemm.cpp checks both against a double-precision product and against each other.
#include <cblas.h>

#include <mutex>

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

// ---- the OpenBLAS path

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

void gemm(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  if (M <= 0 || N <= 0) return;
  check_blas();  // once: pins the threaded build to 1 thread per call (devices call it first anyway)
  if (K <= 0) {  // empty product: C = beta * C (beta == 0 overwrites, as BLAS does, even NaN)
    c.parallel_for(M * N, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) C[i] = beta == 0.0f ? 0.0f : beta * C[i];
    });
    return;
  }
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

}  // namespace d2l::kernels::cpu
