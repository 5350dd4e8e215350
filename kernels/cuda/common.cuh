// Small helpers shared by the kernels/cuda/*.cu launchers (after d2l_cuda.cuh, inside D2L_CUDA_NS):
//   grid_for(n)       the grid of an elementwise kernel over n items (256 threads a block)
//   D2L_LAUNCH_OVER(n, stream, kernel, args...)   an elementwise kernel's launch: nothing when n <= 0,
//                     else grid_for(n) blocks of kThreads, then the launch check
//   axpy_value(a, x, y)   y + a * x rounded as axpy_kernel rounds it (one FMA on a GPU)
//   gemm_store(c, alpha, acc, beta)   a GEMM's C = alpha * acc + beta * C (matmul.cu, matmul_mma.cu)
//   cp_async_pipeline<kStages, kPending>(slices, load, compute)   the cp.async pipeline of the mma kernels
//   ScratchBuffer<T>  a temporary device buffer owned by one launcher (conv2d's col, sum's partials)
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/no_copy.hpp"

#define D2L_LAUNCH_OVER(n, stream, kernel, ...)                        \
  do {                                                                 \
    if ((n) > 0) {                                                     \
      D2L_LAUNCH(kernel, grid_for(n), kThreads, 0, stream)(__VA_ARGS__); \
      D2L_CHECK_LAUNCH(kernel);                                        \
    }                                                                  \
  } while (0)

namespace D2L_CUDA_NS {

// 256 threads a block: 8 warps, a common choice that leaves room for several blocks per SM.
constexpr int kThreads = 256;

// Elementwise kernels loop over their items with a grid-stride loop
//   for (i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
// so the grid only needs to be big enough to keep the device busy, not to cover n:
//   GPU        at most 1024 blocks (262144 threads: more than a current GPU holds at once);
//   emulated   enough blocks for one item a thread: a block that never waits runs its threads as a
//              plain loop (kernels/emu/block.hpp), so thread t + 1 takes the item after thread t's
//              and memory is read in order; a grid-stride loop over few threads would instead walk
//              the array at a stride of the grid, touching every cache line once per thread.
// Results never depend on the grid (each item is independent).
// kMaxReduceBlocks caps grids whose blocks reduce (sum's partials): there every emulated block pays
// fiber switches at its barriers, so the emulation keeps them few.
#ifdef __CUDACC__
constexpr int64_t kMaxBlocks = 1024;
constexpr unsigned kMaxReduceBlocks = 1024;
#else
constexpr int64_t kMaxBlocks = int64_t{1} << 24;
constexpr unsigned kMaxReduceBlocks = 16;
#endif
// Block-wide reductions (block_sum, reduce.cuh: one block per channel, or sum's partials) run
//   GPU        256 threads a block, as everything else;
//   emulated   32 (one warp): every barrier and shuffle of block_sum costs a fiber switch per thread,
//              so a 256-thread block pays 8x the switches of a 32-thread one for the same sum.
//              Each thread strides over more values; the result is the same up to rounding (the
//              order of the additions follows the launch shape, fixed for each build).
#ifdef __CUDACC__
constexpr int kReduceThreads = 256;
#else
constexpr int kReduceThreads = 32;
#endif

// y + a * x as axpy_kernel (add.cu, add_'s kernel) computes `y += a * x`. nvcc contracts that line to one
// fused multiply-add (its default, -fmad=true): a * x + y rounded once. g++ (ISO mode, no contraction)
// rounds the product, then the sum. Kernels that must give add_'s bits (sgd.cu's multi-tensor step, which
// does in one kernel what add_ does in three) call this, as axpy_kernel does, so the two agree in both
// builds whatever the compiler would contract in a longer expression.
// C = alpha * acc + beta * C; with beta == 0, C is not read (it may hold garbage, as in BLAS).
__device__ __forceinline__ void gemm_store(float* c, float alpha, float acc, float beta) {
  *c = beta == 0.0f ? alpha * acc : alpha * acc + beta * *c;
}

// The cp.async pipeline of GEMM kernel6 (matmul_mma.cu) and kernel5's mma core (conv2d_implicit.cu):
// kStages slices in flight. load(s) issues slice s's copies into stage s % kStages as one cp.async group
// (an empty group past the last slice); compute(s) works on slice s. Slices 0 .. kStages - 2 are issued
// first; then for each slice s: wait until at most kPending of this thread's groups are in flight
// (kStages - 2: slice s's copies have landed), one barrier (everyone's have, and everyone is done with
// slice s - 1, whose stage slice s + kStages - 1 now takes), issue that slice, compute on slice s.
// kPending is the caller's, written at the call, where a test can get it wrong on purpose.
template <int kStages, int kPending, class Load, class Compute>
__device__ __forceinline__ void cp_async_pipeline(int64_t slices, Load&& load, Compute&& compute) {
  for (int s = 0; s < kStages - 1; ++s) load(s);
  for (int64_t s = 0; s < slices; ++s) {
    ptx::cp_async_wait<kPending>();
    __syncthreads();
    load(s + kStages - 1);
    compute(s);
  }
  ptx::cp_async_wait<0>();  // the empty groups past the end: nothing in flight at exit
}

__device__ __forceinline__ float axpy_value(float a, float x, float y) {
#ifdef __CUDACC__
  return __fmaf_rn(a, x, y);
#else
  return y + a * x;
#endif
}

inline unsigned grid_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// A temporary device buffer of n values of type T, released when the launcher returns. Its bytes
// count in the device's memory figures (bytes in use, peak) like a tensor's.
//   nvcc      cudaMallocAsync / cudaFreeAsync on the launcher's stream: stream-ordered, so the kernels
//             queued before the free have finished with it before the memory is reused; counted
//             through scratch_counter (set by core for gpu(i) devices).
//   emulated  the emu device's caching allocator (the Ctx's workspace; an emulated launch has
//             finished when it returns), or the heap without one.
template <class T>
class ScratchBuffer : NoCopy {
 public:
  ScratchBuffer(Stream stream, int64_t n) : stream_(stream) {
    if (n <= 0) return;  // nothing to allocate (data() is null)
    bytes_ = static_cast<size_t>(n) * sizeof(T);
#ifdef __CUDACC__
    const cudaError_t e = cudaMallocAsync(reinterpret_cast<void**>(&p_), bytes_, stream);
    if (e != cudaSuccess)
      throw std::runtime_error("scratch buffer of " + std::to_string(bytes_) + " bytes: " + cudaGetErrorString(e));
    if (auto count = scratch_counter()) count(stream, static_cast<int64_t>(bytes_));
#else
    if (stream && stream->workspace) {
      p_ = static_cast<T*>(stream->workspace->get(bytes_));
    } else {
      host_.resize(static_cast<size_t>(n));
      p_ = host_.data();
    }
#endif
  }
  ~ScratchBuffer() {
    if (!p_) return;
#ifdef __CUDACC__
    cudaFreeAsync(p_, stream_);
    if (auto count = scratch_counter()) count(stream_, -static_cast<int64_t>(bytes_));
#else
    if (stream_ && stream_->workspace) stream_->workspace->put(p_, bytes_);
#endif
  }
  T* data() const { return p_; }

 private:
  Stream stream_;
  size_t bytes_ = 0;
  T* p_ = nullptr;
#ifndef __CUDACC__
  std::vector<T> host_;
#endif
};

}  // namespace D2L_CUDA_NS
