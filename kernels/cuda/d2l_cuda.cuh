// What every kernels/cuda/*.cu includes first. Each .cu is compiled twice
// (docs/emulation.md):
//   nvcc (real GPUs)         namespace d2l::kernels::cuda, Stream = cudaStream_t
//   g++ + kernels/emu        namespace d2l::kernels::emu,  Stream = const cpu::Ctx* (thread budget)
// so both can sit in one binary. Write kernels with the project macros, identical in both:
//   namespace D2L_CUDA_NS { ... }                  kernels and launchers
//   D2L_SHARED(float, tile, [16][16]);             static shared memory (__shared__ float tile[16][16];)
//   D2L_DYNAMIC_SHARED(float, buf);                dynamic shared memory, the launch's shmem bytes
//                                                  (extern __shared__ float buf[];), as float* buf
//   D2L_LAUNCH(kernel, grid, block, shmem, stream)(args...);   kernel<<<grid, block, shmem, stream>>>(args...)
//   D2L_CHECK_LAUNCH(kernel);                      after a launch: throws if it failed (nvcc);
//                                                  emulated launches throw by themselves
//   D2L_SET_MAX_DYNAMIC_SHARED(kernel, bytes);     the opt-in to more than 48 KiB of dynamic shared
//                                                  memory (cudaFuncSetAttribute), before launching it
// threadIdx, __syncthreads(), __shfl_down_sync(), atomicAdd(), ... are CUDA's own names; tensor cores are
// wmma::fragment, wmma::mma_sync, ... (nvcuda::wmma; TF32 m16n16k8 under the emulation); PTX's own
// instructions below that API are ptx::cp_async4, ptx::ldmatrix_x4, ptx::mma_tf32_m16n8k8, ...
// (kernels/cuda/ptx.cuh; emulated by kernels/emu/ptx.hpp).
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>  // __nv_bfloat16, __float2bfloat16_rn, ...; the emulation's: kernels/emu/float16.hpp
#include <cuda_fp16.h>  // __half, __float2half_rn, ...
#include <cuda_runtime.h>
#include <mma.h>

#include <stdexcept>
#include <string>

#define D2L_CUDA_NS d2l::kernels::cuda
#define D2L_SHARED(T, name, dims) __shared__ T name dims
// One byte array per name: extern __shared__ arrays of different types in one file would clash.
#define D2L_DYNAMIC_SHARED(T, name)                                            \
  extern __shared__ __align__(16) unsigned char d2l_dynamic_shared_##name[]; \
  T* name = reinterpret_cast<T*>(d2l_dynamic_shared_##name)
#define D2L_LAUNCH(kernel, grid, block, shmem, stream) kernel<<<(grid), (block), (shmem), (stream)>>>
#define D2L_CHECK_LAUNCH(kernel) ::d2l::kernels::cuda::check_launch(#kernel, __FILE__, __LINE__)
#define D2L_SET_MAX_DYNAMIC_SHARED(kernel, bytes) \
  ::d2l::kernels::cuda::check_attribute(          \
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)), #kernel)

namespace d2l::kernels::cuda {
namespace wmma = nvcuda::wmma;  // tensor cores; the emulation's is kernels/emu/wmma.hpp
// A float rounded to TF32 (wmma::__float_to_tf32, which CUDA declares for sm_80 and later only: TF32
// kernels compile to empty bodies below that, and this is the identity there).
__device__ __forceinline__ float to_tf32(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return wmma::__float_to_tf32(x);
#else
  return x;
#endif
}
using Stream = cudaStream_t;
inline void check_attribute(cudaError_t e, const char* kernel) {
  if (e != cudaSuccess)
    throw std::runtime_error(std::string("cudaFuncSetAttribute(") + kernel + ", max dynamic shared memory) failed: " +
                             cudaGetErrorString(e));
}
inline void check_launch(const char* kernel, const char* file, int line) {
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess)
    throw std::runtime_error(std::string(file) + ":" + std::to_string(line) + ": launch of kernel " + kernel +
                             " failed: " + cudaGetErrorString(e));
}
}  // namespace d2l::kernels::cuda
#include "kernels/cuda/ptx.cuh"  // ptx::cp_async4, ptx::ldmatrix_x4, ptx::mma_tf32_m16n8k8, ...

#else
#include "kernels/emu/cuda_emu.hpp"
#endif
