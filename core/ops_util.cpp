#include "core/ops_util.hpp"

#include <atomic>

#include "core/gpu/cuda_layer.hpp"

namespace d2l::detail {

static std::atomic<int> g_gemm{0};  // 0 = cublas (CPU GEMM on emu), else a kernels::emu::GemmKernel

void set_gemm(const std::string& name) {
  if (name == "cublas") g_gemm = 0;
  else if (name == "naive") g_gemm = static_cast<int>(kernels::emu::GemmKernel::naive);
  else if (name == "tiled") g_gemm = static_cast<int>(kernels::emu::GemmKernel::tiled);
  else if (name == "regblock") g_gemm = static_cast<int>(kernels::emu::GemmKernel::regblock);
  else throw ConfigError("bad --gemm '" + name + "': expected cublas, tiled, regblock or naive");
}

void run_gemm(const kernels::cpu::Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  int g = g_gemm.load();
#ifdef D2L_WITH_CUDA
  if (c.cuda_stream) {
    if (g == 0) return cuda_layer::sgemm(c.blas, ta, tb, M, N, K, alpha, A, B, beta, C);
    return kernels::cuda::gemm(static_cast<kernels::cuda::Stream>(c.cuda_stream),
                               static_cast<kernels::cuda::GemmKernel>(g), ta, tb, M, N, K, alpha, A, B, beta, C);
  }
#endif
  if (c.emulated && g != 0)
    kernels::emu::gemm(&c, static_cast<kernels::emu::GemmKernel>(g), ta, tb, M, N, K, alpha, A, B, beta, C);
  else
    kernels::cpu::gemm(c, ta, tb, M, N, K, alpha, A, B, beta, C);
}

void fail(const char* op, const std::string& msg) { throw ShapeError(std::string(op) + ": " + msg); }

Device same_device(const char* op, const std::vector<Tensor>& ts) {
  Device d = ts.at(0).device();
  for (auto& t : ts) {
    if (!t.defined()) fail(op, "an input is undefined");
    if (t.device() != d)
      fail(op, "inputs live on " + d.str() + " and " + t.device().str() +
                   "; copy one with to() first (devices never mix implicitly)");
  }
  return d;
}

void expect_f32(const char* op, const Tensor& t, const char* what) {
  if (t.dtype() != DType::f32) fail(op, std::string(what) + " must be float32");
}

void expect_ndim(const char* op, const Tensor& t, int64_t n, const char* what) {
  if (t.ndim() != n)
    fail(op, std::string(what) + " must have " + std::to_string(n) + " dimensions, got shape " + str(t.shape()));
}

}  // namespace d2l::detail
