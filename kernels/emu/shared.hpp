// Shared memory under the emulation: an arena per OS thread, reset for every block.
//   D2L_SHARED(float, tile, [16][16]);   ->  float (&tile)[16][16] = <block-local arena memory>
//   D2L_DYNAMIC_SHARED(float, buf);      ->  float* buf = <the launch's dynamic bytes>
// (under nvcc the same macros are __shared__ / extern __shared__, kernels/cuda/d2l_cuda.cuh).
// Every thread of a block gets the same address for the same declaration: the declaration's key
// is the address of a function-local static, so each kernel (and each template instance) has its
// own. Memory is filled with 0xFF bytes (NaN as float or double, -1 as int) when a block first
// uses it, so reading a slot nobody wrote in this block, e.g. after a missing __syncthreads,
// shows as NaN, and a wrong result is the same on every run.
// Layout: dynamic bytes first (offset 0), then static arrays in first-use order, 16-byte aligned;
// under ASan each is followed by a poisoned redzone, so indexing past an array is reported.
#pragma once
#include <cstddef>

namespace d2l::cuda_emu {

// 48 KiB: what a CUDA block may use on every architecture without opting in; more is an error
// naming the kernel, as a real launch would fail. A kernel opted in (set_max_dynamic_shared, as
// cudaFuncSetAttribute's cudaFuncAttributeMaxDynamicSharedMemorySize) may take that many bytes of
// dynamic shared memory, and up to kSharedOptInBytes (sm_90's per-block maximum, 227 KiB) in all.
inline constexpr size_t kSharedBytes = 48 * 1024;
inline constexpr size_t kSharedOptInBytes = 227 * 1024;

// The opt-in of the kernel at `kernel` (its address): its launches may ask for up to `bytes` of
// dynamic shared memory (at most kSharedOptInBytes, else std::invalid_argument). 0 until set.
void set_max_dynamic_shared(const void* kernel, size_t bytes);
size_t max_dynamic_shared(const void* kernel);

// The block's memory for the declaration `key` (allocated and NaN-filled at its first use in
// the block). Throws when the block's shared memory would pass kSharedBytes.
void* shared_static(const void* key, size_t bytes, size_t align);
// The block's dynamic shared memory (the launch's shmem bytes, NaN-filled at block start).
void* shared_dynamic();

}  // namespace d2l::cuda_emu

#define D2L_SHARED(T, name, dims)                                                                    \
  static constexpr char d2l_shared_key_##name = 0;                                                 \
  T(&name) dims = *static_cast<T(*) dims>(                                                         \
      ::d2l::cuda_emu::shared_static(&d2l_shared_key_##name, sizeof(T dims), alignof(T)))

#define D2L_DYNAMIC_SHARED(T, name) T* name = static_cast<T*>(::d2l::cuda_emu::shared_dynamic())
