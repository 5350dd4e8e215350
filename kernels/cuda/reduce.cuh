// Warp and block reductions for kernels/cuda/*.cu (after d2l_cuda.cuh, inside D2L_CUDA_NS).
// The order of the additions is fixed by the launch shape alone (a tree over lanes, then over
// warps), so the same inputs and the same launch give the same bits on every run, unlike atomics.
// Every thread of the block (blockDim.x a multiple of 32) must call them: they contain barriers.
#pragma once

namespace D2L_CUDA_NS {

// Tree over the 32 lanes: after the loop lane 0 holds the warp's total (others hold partial sums).
template <class T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffffu, v, offset);
  return v;
}

// The largest of the 32 lanes' values, in every lane (xor butterfly).
__device__ __forceinline__ float warp_max(float v) {
  for (int mask = 16; mask > 0; mask /= 2) {
    const float other = __shfl_xor_sync(0xffffffffu, v, mask);
    v = other > v ? other : v;
  }
  return v;
}

// The block's total, returned to every thread. warp_sums: shared memory for 32 values.
// 1) each warp sums its lanes; 2) lane 0 of each warp stores the warp's total; 3) warp 0 sums those.
template <class T>
__device__ __forceinline__ T block_sum(T v, T* warp_sums) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = (blockDim.x + 31) / 32;
  v = warp_sum(v);
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();  // every warp's total is stored
  if (warp == 0) {
    v = lane < warps ? warp_sums[lane] : T(0);
    v = warp_sum(v);
    if (lane == 0) warp_sums[0] = v;
  }
  __syncthreads();  // the total is stored
  const T total = warp_sums[0];
  __syncthreads();  // everyone has read it: warp_sums may be reused
  return total;
}

}  // namespace D2L_CUDA_NS
