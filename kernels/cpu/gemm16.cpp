// The 16-bit GEMMs: C (M, N) float32 = alpha * op(A) @ op(B) + beta * C, A and B bfloat16 or float16
// (kernels.hpp). Sums in float32 over products that are exact in float32.
#include "kernels.hpp"

namespace d2l::kernels::cpu {

// ---- kernel1: gemm_naive's loops over widened values. Threads take whole rows of C.
void gemm16_naive(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const uint16_t* A, const uint16_t* B, float beta, float* C) {
  c.parallel_for(M, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i)
      for (int64_t j = 0; j < N; ++j) {
        float acc = 0.0f;
        for (int64_t k = 0; k < K; ++k)
          acc += widen(f, ta ? A[k * M + i] : A[i * K + k]) * widen(f, tb ? B[j * K + k] : B[k * N + j]);
        C[i * N + j] = alpha * acc + (beta == 0.0f ? 0.0f : beta * C[i * N + j]);
      }
  });
}

// ---- the portable member: widening is exact, and so is every product of two widened values, so
// the float32 GEMM of the widened operands computes what a 16-bit GEMM with float32 sums computes.
// The scratch holds both operands in float32 (4 (M K + K N) bytes) for the length of the call.
void gemm16_widened(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const uint16_t* A, const uint16_t* B, float beta, float* C) {
  Scratch<float> a(c.workspace, M * K), b(c.workspace, K * N);
  auto widen_all = [&](const uint16_t* from, float* to, int64_t n) {
    c.parallel_for(n, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) to[i] = widen(f, from[i]);
    });
  };
  widen_all(A, a.data(), M * K);
  widen_all(B, b.data(), K * N);
  gemm(c, ta, tb, M, N, K, alpha, a.data(), b.data(), beta, C);
}

// ---- what the ops call: bfloat16 on VDPBF16PS where the CPU has it (gemm16_dpbf16.cpp), else the
// portable member.
void gemm16(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
            const uint16_t* B, float beta, float* C) {
  if (f == Float16::bf16 && has_avx512_bf16()) return gemm16_dpbf16(c, true, ta, tb, M, N, K, alpha, A, B, beta, C);
  gemm16_widened(c, f, ta, tb, M, N, K, alpha, A, B, beta, C);
}

}  // namespace d2l::kernels::cpu
