// Launchers of the hand-written CUDA kernels, declared once for both builds of kernels/cuda/*.cu.
// No include guard on purpose: it is included once per namespace, with D2L_CUDA_NS and that
// namespace's Stream already defined:
//   host code using the emulated kernels   #include "kernels/emu/kernels.hpp"   (d2l::kernels::emu)
//   host code using the nvcc-built ones    #include "kernels/cuda/gpu.hpp"      (d2l::kernels::cuda)
//   a .cu file                             after "kernels/cuda/d2l_cuda.cuh"
// Pointers are device pointers (host memory for emu). Semantics mirror kernels/cpu/kernels.hpp;
// a launch returns once queued on `stream` (emulated: once finished).
#include <cstdint>

namespace D2L_CUDA_NS {

// ---- matmul.cu: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major.
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)). beta == 0: C is
// not read. Which kernel of the family runs is the caller's choice (--gemm naive|tiled|...).
enum class GemmKernel { naive = 1, tiled = 2, regblock = 3 };
void gemm(Stream stream, GemmKernel kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C);

}  // namespace D2L_CUDA_NS
