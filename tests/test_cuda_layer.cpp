// The parts of the CUDA runtime layer (core/gpu) that are plain arithmetic, checked without a GPU:
// the column-major cuBLAS arguments of a row-major GEMM, evaluated by OpenBLAS in column-major mode
// (the same convention as cuBLAS) against a double loop. A swapped operand, a wrong transpose flag
// or leading dimension gives a different product or an out-of-bounds read (ASan).
#include <doctest/doctest.h>
#include <cblas.h>

#include <vector>

#include "check.hpp"
#include "core/gpu/cuda_layer.hpp"

using d2l::test::lcg_data;

TEST_CASE("col_major_gemm: cuBLAS-style arguments reproduce the row-major product for every transpose") {
  const int64_t M = 7, N = 5, K = 3;
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      CAPTURE(ta);
      CAPTURE(tb);
      auto A = lcg_data(M * K, 1), B = lcg_data(K * N, 2), C = lcg_data(M * N, 3);
      const float alpha = 1.5f, beta = 0.5f;
      std::vector<double> ref(M * N);
      for (int64_t i = 0; i < M; ++i)
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t k = 0; k < K; ++k) acc += double(ta ? A[k * M + i] : A[i * K + k]) * (tb ? B[j * K + k] : B[k * N + j]);
          ref[i * N + j] = alpha * acc + beta * C[i * N + j];
        }
      auto g = d2l::cuda_layer::col_major_gemm(ta, tb, M, N, K);
      cblas_sgemm(CblasColMajor, g.trans_first ? CblasTrans : CblasNoTrans, g.trans_second ? CblasTrans : CblasNoTrans,
                  g.m, g.n, g.k, alpha, B.data(), g.ld_first, A.data(), g.ld_second, beta, C.data(), g.ldc);
      for (int64_t i = 0; i < M * N; ++i) REQUIRE(C[i] == doctest::Approx(ref[i]).epsilon(1e-5));
    }
}
