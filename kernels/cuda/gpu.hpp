// The nvcc-built CUDA kernels for host code compiled by g++ (gpu(i) devices): kernels.hpp's
// launchers in namespace d2l::kernels::cuda. Stream is cudaStream_t, declared here without
// cuda_runtime.h. Only linkable when the project was built with nvcc (gpu_enabled).
#pragma once

struct CUstream_st;  // cudaStream_t is CUstream_st*

namespace d2l::kernels::cuda {
using Stream = ::CUstream_st*;
}  // namespace d2l::kernels::cuda

#pragma push_macro("D2L_CUDA_NS")
#undef D2L_CUDA_NS
#define D2L_CUDA_NS d2l::kernels::cuda
#include "kernels/cuda/kernels.hpp"
#undef D2L_CUDA_NS
#pragma pop_macro("D2L_CUDA_NS")
