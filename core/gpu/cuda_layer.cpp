// The CUDA runtime layer (see cuda_layer.hpp). Compiled only in a build with nvcc.
#include "core/gpu/cuda_layer.hpp"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <mutex>
#include <set>
#include <string>
#include <type_traits>
#include <utility>

#include "core/device.hpp"  // DeviceError
#include "kernels/cuda/gpu.hpp"  // uses_tf32: --precision

namespace d2l::cuda_layer {

namespace {

[[noreturn]] void fail(const char* call, const char* file, int line, const std::string& why) {
  throw DeviceError(std::string(file) + ":" + std::to_string(line) + ": " + call + " failed: " + why);
}
void check(cudaError_t e, const char* call, const char* file, int line) {
  if (e != cudaSuccess) {
    cudaGetLastError();  // clear a non-sticky error so the next call starts clean
    fail(call, file, line, cudaGetErrorString(e));
  }
}

// cuBLAS is opened at the first blas handle, not linked: loading libcublasLt applies 350,000
// relocations, 0.4 s at every program's start on a 2-core machine (0.2 s of it page faults), also in
// those that never reach a GPU (--help, a bad flag, a run on CPU devices, each rank of a test).
// Each function is looked up under the name cublas_v2.h gives it (cublasCreate is cublasCreate_v2).
#define D2L_NAME(fn) D2L_NAME_OF(fn)
#define D2L_NAME_OF(fn) #fn
struct Cublas {
  decltype(&cublasCreate) create;
  decltype(&cublasSetStream) set_stream;
  decltype(&cublasSetMathMode) set_math_mode;
  decltype(&cublasSgemm) sgemm;
  // The C entry point (cublas_api.h also declares a C++ overload taking the compute type as a cudaDataType).
  cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
                            const void*, cudaDataType, int, const void*, cudaDataType, int, const void*, void*,
                            cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  decltype(&cublasGetStatusString) status_string;
};
const Cublas& cublas() {
  static const Cublas api = [] {
    const std::string name = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!lib) throw DeviceError("cuBLAS could not be loaded: " + std::string(dlerror()));
    auto find = [&](auto& fn, const char* symbol) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, symbol));
      if (!fn) throw DeviceError(name + " has no " + symbol);
    };
    Cublas c{};
    find(c.create, D2L_NAME(cublasCreate));
    find(c.set_stream, D2L_NAME(cublasSetStream));
    find(c.set_math_mode, D2L_NAME(cublasSetMathMode));
    find(c.sgemm, D2L_NAME(cublasSgemm));
    find(c.gemm_ex, D2L_NAME(cublasGemmEx));
    find(c.status_string, D2L_NAME(cublasGetStatusString));
    return c;
  }();
  return api;
}

void check(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s != CUBLAS_STATUS_SUCCESS) fail(call, file, line, cublas().status_string(s));
}
#define D2L_CHECK(call) check((call), #call, __FILE__, __LINE__)

cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

// Restores the calling thread's current device when a copy had to switch it.
struct DeviceGuard {
  int saved = 0;
  explicit DeviceGuard(int gpu) {
    D2L_CHECK(cudaGetDevice(&saved));
    if (gpu != saved) D2L_CHECK(cudaSetDevice(gpu));
  }
  ~DeviceGuard() { cudaSetDevice(saved); }
};

// Peer access dst -> src, enabled once per pair; false when the hardware has none.
bool peer_access(int dst, int src) {
  static std::mutex mu;
  static std::set<std::pair<int, int>> enabled, unavailable;
  std::lock_guard<std::mutex> lock(mu);
  if (enabled.count({dst, src})) return true;
  if (unavailable.count({dst, src})) return false;
  int can = 0;
  D2L_CHECK(cudaDeviceCanAccessPeer(&can, dst, src));
  if (!can) {
    unavailable.insert({dst, src});
    return false;
  }
  DeviceGuard on(dst);
  cudaError_t e = cudaDeviceEnablePeerAccess(src, 0);
  if (e == cudaErrorPeerAccessAlreadyEnabled) cudaGetLastError();
  else D2L_CHECK(e);
  enabled.insert({dst, src});
  return true;
}

// Between two GPUs without peer access: device -> pinned host buffer -> device, in chunks.
void staged_copy(void* dst, int dst_gpu, const void* src, int src_gpu, size_t bytes, cudaStream_t stream) {
  constexpr size_t chunk = size_t(4) << 20;
  thread_local void* pinned = nullptr;  // one per copy thread, kept for the process's life
  if (!pinned) D2L_CHECK(cudaMallocHost(&pinned, chunk));
  for (size_t done = 0; done < bytes; done += chunk) {
    size_t n = std::min(chunk, bytes - done);
    {
      DeviceGuard on(src_gpu);
      D2L_CHECK(cudaMemcpy(pinned, static_cast<const char*>(src) + done, n, cudaMemcpyDeviceToHost));
    }
    DeviceGuard on(dst_gpu);
    D2L_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, pinned, n, cudaMemcpyHostToDevice, stream));
    D2L_CHECK(cudaStreamSynchronize(stream));  // the buffer is reused by the next chunk
  }
}

}  // namespace

void set_device(int gpu) { D2L_CHECK(cudaSetDevice(gpu)); }

void* malloc(int gpu, size_t bytes) {
  DeviceGuard on(gpu);
  void* p = nullptr;
  D2L_CHECK(cudaMalloc(&p, bytes));
  return p;
}

void free(int gpu, void* p) {
  if (cudaSetDevice(gpu) != cudaSuccess || cudaFree(p) != cudaSuccess) cudaGetLastError();
}

void fill_bytes(int gpu, void* p, unsigned char byte, size_t bytes) {
  // Our streams are non-blocking, so the legacy stream of cudaMemset does not order with them: wait
  // for queued kernels (a reused block may still be read by one), fill, and wait again.
  DeviceGuard on(gpu);
  D2L_CHECK(cudaDeviceSynchronize());
  D2L_CHECK(cudaMemset(p, byte, bytes));
  D2L_CHECK(cudaDeviceSynchronize());
}

void* stream_create(int gpu) {
  DeviceGuard on(gpu);
  cudaStream_t s = nullptr;
  D2L_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
}

void stream_synchronize(int gpu, void* stream) {
  DeviceGuard on(gpu);
  D2L_CHECK(cudaStreamSynchronize(as_stream(stream)));
}

void* blas_create(int gpu, void* stream) {
  DeviceGuard on(gpu);
  cublasHandle_t h = nullptr;
  D2L_CHECK(cublas().create(&h));
  D2L_CHECK(cublas().set_stream(h, as_stream(stream)));
  return h;
}

void copy(void* dst, int dst_gpu, const void* src, int src_gpu, size_t bytes, void* stream_ptr, bool wait) {
  if (bytes == 0) return;
  cudaStream_t stream = as_stream(stream_ptr);
  int on = dst_gpu >= 0 ? dst_gpu : src_gpu;
  if (dst_gpu >= 0 && src_gpu >= 0 && dst_gpu != src_gpu) {
    if (!peer_access(dst_gpu, src_gpu)) return staged_copy(dst, dst_gpu, src, src_gpu, bytes, stream);
    DeviceGuard guard(on);
    D2L_CHECK(cudaMemcpyPeerAsync(dst, dst_gpu, src, src_gpu, bytes, stream));
  } else {
    DeviceGuard guard(on);
    D2L_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream));
  }
  if (wait) {
    DeviceGuard guard(on);
    D2L_CHECK(cudaStreamSynchronize(stream));
  }
}

// --precision for cuBLAS (kernels::cuda::uses_tf32): TF32 tensor-op math (inputs rounded to TF32, FP32
// sums) for tf32, and for automatic on a GPU of compute capability 8.0 or more; plain FP32 otherwise.
void sgemm(void* blas, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
           const float* B, float beta, float* C) {
  auto h = static_cast<cublasHandle_t>(blas);
  D2L_CHECK(cublas().set_math_mode(h, kernels::cuda::uses_tf32() ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
  ColMajorGemm g = col_major_gemm(ta, tb, M, N, K);
  D2L_CHECK(cublas().sgemm(h, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N, g.m,
                        g.n, g.k, &alpha, B, g.ld_first, A, g.ld_second, &beta, C, g.ldc));
}

void gemm16(void* blas, bool bf16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
            const uint16_t* B, float beta, float* C) {
  auto h = static_cast<cublasHandle_t>(blas);
  D2L_CHECK(cublas().set_math_mode(h, CUBLAS_DEFAULT_MATH));
  const cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_16F;
  ColMajorGemm g = col_major_gemm(ta, tb, M, N, K);
  D2L_CHECK(cublas().gemm_ex(h, g.trans_first ? CUBLAS_OP_T : CUBLAS_OP_N, g.trans_second ? CUBLAS_OP_T : CUBLAS_OP_N,
                             g.m, g.n, g.k, &alpha, B, t, g.ld_first, A, t, g.ld_second, &beta, C, CUDA_R_32F, g.ldc,
                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

}  // namespace d2l::cuda_layer
