// The cuBLAS arguments of a row-major GEMM (see cuda_layer.hpp). Part of every build, so that the
// CPU tests can check it against a column-major BLAS call; only gpu(i) devices use it for real.
#include "core/gpu/cuda_layer.hpp"

namespace d2l::cuda_layer {

ColMajorGemm col_major_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K) {
  // Row-major X (r, c) is column-major X^T (c, r) with leading dimension c. B stored (K, N), or (N, K)
  // when tb, is seen as B^T or B: the product wants op(B)^T, which is the stored view when !tb.
  const int m = static_cast<int>(N), n = static_cast<int>(M), k = static_cast<int>(K);
  return ColMajorGemm{tb, ta, m, n, k, tb ? k : m, ta ? n : k, m};
}

}  // namespace d2l::cuda_layer
