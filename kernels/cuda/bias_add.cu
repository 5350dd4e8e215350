// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
// The CUDA twin of kernels/cpu/bias_add.cpp.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"
#include "kernels/cuda/channel_chunks.cuh"

namespace D2L_CUDA_NS {

// Threads: one element per thread per grid-stride step; element k = (o * C + c) * inner + i has
// channel c = (k / inner) % C.
__global__ void bias_add_forward_kernel(const float* x, const float* __restrict__ b, float* y, int64_t outer,
                                        int64_t C, int64_t inner) {
  const int64_t n = outer * C * inner, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t k = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; k < n; k += stride)
    y[k] = x[k] + b[k / inner % C];
}

// The backward in two passes, as BatchNorm's sums (channel_chunks.cuh: a channel's outer * inner
// values cut into chunks, float4 loads where inner is a multiple of 4, no division per value):
//   1. partial sums: grid (chunks, channels), each block sums its chunk in double (block_sum,
//      reduce.cuh: a fixed tree order) into its own slot;
//   2. one thread per channel adds the chunks' sums in chunk order: db.
// No atomics and a fixed order, so db has the same bits on every run.
__global__ void bias_add_partial_sums_kernel(ChannelChunks w, int64_t first_channel, const float* __restrict__ dy,
                                             double* __restrict__ partials) {
  D2L_SHARED(double, warp_sums, [32]);
  const int64_t ch = first_channel + blockIdx.y;
  const int chunk = static_cast<int>(blockIdx.x);
  double s = 0.0;
  for_thread_loads(w, ch, chunk, [&](int64_t at) {
    float v[4] = {};
    load_values(dy + at, w.vec, v);
    for (int e = 0; e < 4; ++e)
      if (e < w.vec) s += v[e];
  });
  s = block_sum(s, warp_sums);
  if (threadIdx.x == 0) partials[ch * w.chunks + chunk] = s;
}

__global__ void bias_add_finish_sums_kernel(ChannelChunks w, const double* __restrict__ partials,
                                            float* __restrict__ db) {
  for (int64_t ch = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; ch < w.C; ch += int64_t(gridDim.x) * blockDim.x) {
    double s = 0.0;
    for (int b = 0; b < w.chunks; ++b) s += partials[ch * w.chunks + b];
    db[ch] = static_cast<float>(s);
  }
}

void bias_add_forward(Stream stream, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner) {
  const int64_t n = outer * C * inner;
  D2L_LAUNCH_OVER(n, stream, bias_add_forward_kernel, x, b, y, outer, C, inner);
}

void bias_add_backward(Stream stream, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  if (C <= 0) return;
  const ChannelChunks w = channel_chunks("bias_add_backward", outer, C, inner, kReduceThreads, aligned16(dy));
  ScratchBuffer<double> partials(stream, C * w.chunks);
  for_channel_slices(w.chunks > 0 ? C : 0, [&](int64_t c0, int64_t count) {  // no values: no chunks, db = 0
    const dim3 grid(static_cast<unsigned>(w.chunks), static_cast<unsigned>(count));
    D2L_LAUNCH(bias_add_partial_sums_kernel, grid, kReduceThreads, 0, stream)(w, c0, dy, partials.data());
    D2L_CHECK_LAUNCH(bias_add_partial_sums_kernel);
  });
  D2L_LAUNCH(bias_add_finish_sums_kernel, grid_for(C), kThreads, 0, stream)(w, partials.data(), db);
  D2L_CHECK_LAUNCH(bias_add_finish_sums_kernel);
}

}  // namespace D2L_CUDA_NS
