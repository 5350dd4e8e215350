// sum: out[0] = x[0] + ... + x[n-1], accumulated in double, rounded to float once at the end.
// The CUDA twin of kernels/cpu/sum.cpp, as the classic two-pass block reduction:
//   pass 1  sum_partials_kernel  grid_for(n) blocks (at most kMaxReduceBlocks) of kReduceThreads
//           threads (common.cuh: 256 on a GPU, 32 emulated); each thread sums a grid-stride
//           share of x in double; the block adds its threads' shares (block_sum: warp shuffles,
//           then one value per warp through shared memory) into partial[blockIdx.x];
//   pass 2  sum_final_kernel     one block adds the partials the same way and writes out[0].
// No atomics: the order of every addition is fixed by n and the grid, so the result is the same
// on every run (it may differ from the CPU's in the last bits: another order of the same sum).
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

__global__ void sum_partials_kernel(const float* __restrict__ x, double* __restrict__ partial, int64_t n) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  double s = 0.0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) s += x[i];
  s = block_sum(s, warp_sums);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// One block: thread t adds partials t, t + blockDim.x, ...
__global__ void sum_final_kernel(const double* __restrict__ partial, int64_t blocks, float* __restrict__ out) {
  D2L_SHARED(double, warp_sums, [32]);
  double s = 0.0;
  for (int64_t b = threadIdx.x; b < blocks; b += blockDim.x) s += partial[b];
  s = block_sum(s, warp_sums);
  if (threadIdx.x == 0) out[0] = static_cast<float>(s);
}

void sum(Stream stream, const float* x, float* out, int64_t n) {
  const unsigned g = grid_for(n), blocks = g < kMaxReduceBlocks ? g : kMaxReduceBlocks;  // n == 0: out[0] = 0
  ScratchBuffer<double> partial(stream, blocks);
  D2L_LAUNCH(sum_partials_kernel, blocks, kReduceThreads, 0, stream)(x, partial.data(), n);
  D2L_CHECK_LAUNCH(sum_partials_kernel);
  D2L_LAUNCH(sum_final_kernel, 1, kReduceThreads, 0, stream)(partial.data(), int64_t{blocks}, out);
  D2L_CHECK_LAUNCH(sum_final_kernel);
}

}  // namespace D2L_CUDA_NS
