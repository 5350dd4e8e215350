// CUDA on the CPU: what a kernels/cuda/*.cu file sees when g++ compiles it (through
// kernels/cuda/d2l_cuda.cuh). Kernels and launchers land in D2L_CUDA_NS = d2l::kernels::emu, where
// the CUDA built-ins (threadIdx, __syncthreads, __shfl_down_sync, atomicAdd, dim3, ...) are
// visible unqualified, as they are under nvcc. The parts:
//   fiber.hpp     one emulated thread = one fiber (own stack, cooperative switches)
//   block.hpp     a block: its fibers on one OS thread, barriers, deadlock report, shared memory
//   shared.hpp    D2L_SHARED / D2L_DYNAMIC_SHARED
//   builtins.hpp  index variables, barriers, shuffles, atomics, intrinsics, float4
//   float16.hpp   __nv_bfloat16 and __half, and CUDA's conversions of them
//   wmma.hpp      tensor cores: nvcuda::wmma's TF32 fragments, as `wmma`
//   ptx.hpp       cp.async, ldmatrix and mma.sync (m16n8k8 TF32) with PTX's per-lane fragments, as `ptx`
//   launch.hpp    D2L_LAUNCH's runtime: blocks over the device's threads, the launch log
// Device code must live inside D2L_CUDA_NS (the built-ins are not in the global namespace).
#pragma once

#include "kernels/emu/builtins.hpp"
#include "kernels/emu/float16.hpp"
#include "kernels/emu/launch.hpp"
#include "kernels/emu/ptx.hpp"
#include "kernels/emu/shared.hpp"
#include "kernels/emu/wmma.hpp"

// CUDA qualifiers mean nothing on the CPU. (g++ knows __restrict__ itself.)
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __align__(n) alignas(n)
// A plain __shared__ cannot be emulated per block: say so at compile time.
#define __shared__ static_assert(false, "write D2L_SHARED(T, name, dims) instead of __shared__ (kernels/emu)");

#define D2L_CUDA_NS d2l::kernels::emu

// D2L_LAUNCH(kernel, grid, block, shmem_bytes, stream)(args...): kernel<<<grid, block, shmem, stream>>>(args...)
// under nvcc. A template kernel goes in parentheses: D2L_LAUNCH((k<64, 4>), grid, block, 0, s)(...).
#define D2L_LAUNCH(kernel, grid, block, shmem, stream) \
  ::d2l::cuda_emu::make_launch(#kernel, kernel, (grid), (block), (shmem), (stream))
// Emulated launches throw their own errors; nvcc's version checks cudaGetLastError.
#define D2L_CHECK_LAUNCH(kernel) ((void)0)
// D2L_SET_MAX_DYNAMIC_SHARED(kernel, bytes): cudaFuncSetAttribute(kernel,
// cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) under nvcc, the opt-in above 48 KiB.
#define D2L_SET_MAX_DYNAMIC_SHARED(kernel, bytes) \
  ::d2l::cuda_emu::set_max_dynamic_shared(reinterpret_cast<const void*>(kernel), (bytes))

namespace d2l::kernels::emu {
using namespace ::d2l::cuda_emu::builtins;
namespace wmma = ::d2l::cuda_emu::wmma;  // tensor cores (TF32), kernels/emu/wmma.hpp
namespace ptx = ::d2l::cuda_emu::ptx;    // PTX's cp.async, ldmatrix, mma.sync, kernels/emu/ptx.hpp
inline float to_tf32(float x) { return wmma::__float_to_tf32(x); }  // as d2l_cuda.cuh's
using Stream = ::d2l::cuda_emu::Stream;  // the emu device's thread budget; null = calling thread only
}  // namespace d2l::kernels::emu
