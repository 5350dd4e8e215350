// The real CUDA runtime layer of gpu(i) devices (docs/devices-and-streams.md): the only
// code of the project that needs a GPU to run. It is small on purpose; everything above it (the
// caching allocator, streams and events, copies, ops) is shared with cpu(i) and emu(i).
//
// core/gpu/cuda_layer.cpp is compiled when the project is built with nvcc (D2L_WITH_CUDA);
// core/gpu/cuda_layer_none.cpp otherwise: there every call throws, and runtime() never gets that far
// because a CUDA-less build reports 0 GPUs. Handles are void* so this header needs no CUDA headers:
// a stream is a cudaStream_t, a blas handle a cublasHandle_t.
#pragma once
#include <cstddef>
#include <cstdint>

namespace d2l::cuda_layer {

// Every `gpu` argument here is a physical GPU's ordinal (what cudaSetDevice takes), never a logical
// gpu(i)'s index: callers pass DeviceRuntime::physical (core/device.hpp "Logical GPUs").
//
// Every CUDA and cuBLAS call is checked; a failure throws DeviceError
// "core/gpu/cuda_layer.cpp:57: cudaMalloc(&p, bytes) failed: out of memory".

void set_device(int gpu);  // the calling thread's current device

// Device memory (cudaMalloc / cudaFree). free() ignores errors: it also runs at process exit, after
// the CUDA runtime may have shut down. fill_bytes() waits for the GPU's queued work, then fills.
void* malloc(int gpu, size_t bytes);
void free(int gpu, void* p);
void fill_bytes(int gpu, void* p, unsigned char byte, size_t bytes);

// A non-blocking stream of `gpu`, and its synchronisation from the host. Streams and cuBLAS handles
// live until the process ends.
void* stream_create(int gpu);
void stream_synchronize(int gpu, void* stream);
void* blas_create(int gpu, void* stream);  // a cuBLAS handle whose work goes to `stream`

// Copies `bytes` from src to dst. A side that is -1 is host memory, otherwise device memory of that
// GPU. Queued on `stream` (a stream of dst's GPU, or of src's when dst is host memory; null: the
// legacy default stream). wait = true: returns once the copy is complete. Between two GPUs it uses
// cudaMemcpyPeerAsync when peer access is available, otherwise stages through pinned host memory;
// dst_gpu == src_gpu (two logical GPUs of one physical GPU, or one device) is a plain
// device-to-device cudaMemcpyAsync on `stream`.
void copy(void* dst, int dst_gpu, const void* src, int src_gpu, size_t bytes, void* stream, bool wait);

// C (M, N) = alpha op(A) @ op(B) + beta C, row-major, with cuBLAS on the handle's stream.
// cuBLAS is column-major: a row-major (M, N) C is a column-major (N, M) C^T = op(B)^T op(A)^T, so
// B is passed first and A second, each keeping its own transpose flag. col_major_gemm() gives the
// arguments (pure arithmetic, tested on the CPU against a column-major BLAS).
struct ColMajorGemm {
  bool trans_first, trans_second;  // op of the first operand (B) and of the second (A)
  int m, n, k;                     // of the column-major product: m = N, n = M, k = K
  int ld_first, ld_second, ldc;
};
ColMajorGemm col_major_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K);
void sgemm(void* blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const float* B, float beta, float* C);
// cublasGemmEx with A and B bfloat16 (bf16) or float16, C float32, CUBLAS_COMPUTE_32F: the 16-bit GEMM
// (kernels/cpu/kernels.hpp's gemm16) as the library computes it, on tensor cores.
void gemm16(void* blas, bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
            const uint16_t* B, float beta, float* C);

}  // namespace d2l::cuda_layer
