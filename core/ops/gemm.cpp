// Which GEMM the ops run (set_gemm, the --gemm flag) and run_gemm, the one call matmul and conv2d make.
#include "core/ops/op.hpp"

#include <atomic>

#include "core/gpu/cuda_layer.hpp"

namespace d2l::detail {

static std::atomic<int> g_gemm{0};  // 0 = cublas (CPU GEMM on emu), else a kernels::emu::GemmKernel

// The library GEMMs conv2d's passes call when the choice is cublas: on emu(i) the CPU GEMM (the
// emulated stream is the device's CPU Ctx), on gpu(i) cuBLAS on the handle of the LaunchCtx whose kernel runs
// (GpuCtxScope, set by D2L_KERNEL).
static void emu_library_gemm(kernels::emu::Stream s, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                             const float* A, const float* B, float beta, float* C) {
  kernels::cpu::gemm(s ? *s : kernels::cpu::serial_ctx(), ta, tb, M, N, K, alpha, A, B, beta, C);  // null: this thread
}
#ifdef D2L_WITH_CUDA
static thread_local const LaunchCtx* t_gpu_ctx = nullptr;
GpuCtxScope::GpuCtxScope(const LaunchCtx& c) : prev_(t_gpu_ctx) { t_gpu_ctx = &c; }
GpuCtxScope::~GpuCtxScope() { t_gpu_ctx = prev_; }
static void gpu_library_gemm(kernels::cuda::Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                             float alpha, const float* A, const float* B, float beta, float* C) {
  // Outside an op (a conv2d launcher called directly, as gpu_gemm_bench does) there is no handle:
  // the hand-written tiled kernel, conv2d's own default.
  if (!t_gpu_ctx)
    return kernels::cuda::gemm(stream, kernels::cuda::GemmKernel::tiled, ta, tb, M, N, K, alpha, A, B, beta, C);
  cuda_layer::sgemm(t_gpu_ctx->blas, ta, tb, M, N, K, alpha, A, B, beta, C);
}
#endif

// Dense layers read g_gemm at each call; conv2d keeps its own copy of the choice (kernels/cuda).
static void set_conv_gemm(int g) {
  const auto k = static_cast<kernels::emu::GemmKernel>(g == 0 ? 2 : g);
  kernels::emu::set_conv2d_gemm(k, g == 0 ? &emu_library_gemm : nullptr);
#ifdef D2L_WITH_CUDA
  kernels::cuda::set_conv2d_gemm(static_cast<kernels::cuda::GemmKernel>(static_cast<int>(k)),
                                 g == 0 ? &gpu_library_gemm : nullptr);
#endif
}
[[maybe_unused]] static const bool g_conv_default = (set_conv_gemm(0), true);  // cublas, as g_gemm

// --gemm names a member of one family or the other: the GPU's (cublas, tiled, regblock, warptiled, tf32, mma) or the CPU's
// (openblas, packed, blocked); naive is kernel1 of both; auto is each family's default (cuBLAS on GPUs,
// kernels::cpu's per-shape choice on CPUs). The family a name does not belong to keeps its default.
// mma is PTX's tensor-core path for every GEMM of a TF32 run: kernel6, and conv2d's kernel5 on its mma core
// (kernels/cuda/conv2d_implicit.cu); any other name leaves kernel5 on its wmma core.
void set_gemm(const std::string& name) {
  using kernels::cpu::GemmKernel;
  int g = 0;
  GemmKernel cpu = GemmKernel::automatic;
  if (name == "auto" || name == "cublas") g = 0;
  else if (name == "naive") g = static_cast<int>(kernels::emu::GemmKernel::naive), cpu = GemmKernel::naive;
  else if (name == "tiled") g = static_cast<int>(kernels::emu::GemmKernel::tiled);
  else if (name == "regblock") g = static_cast<int>(kernels::emu::GemmKernel::regblock);
  else if (name == "warptiled") g = static_cast<int>(kernels::emu::GemmKernel::warptiled);
  else if (name == "tf32") g = static_cast<int>(kernels::emu::GemmKernel::tf32);
  else if (name == "mma") g = static_cast<int>(kernels::emu::GemmKernel::mma);
  else if (name == "openblas") cpu = GemmKernel::openblas;
  else if (name == "packed") cpu = GemmKernel::packed;
  else if (name == "blocked") cpu = GemmKernel::blocked;
  else
    throw ConfigError("bad --gemm '" + name +
                      "': expected auto, cublas, tiled, regblock, warptiled, tf32, mma (GPUs), openblas, packed, blocked (CPUs) or naive");
  g_gemm = g;
  set_conv_gemm(g);
  const bool mma = name == "mma";
  kernels::emu::set_conv2d_implicit_core(mma ? kernels::emu::ImplicitCore::mma : kernels::emu::ImplicitCore::wmma);
#ifdef D2L_WITH_CUDA
  kernels::cuda::set_conv2d_implicit_core(mma ? kernels::cuda::ImplicitCore::mma : kernels::cuda::ImplicitCore::wmma);
#endif
  kernels::cpu::set_gemm_kernel(cpu);
}

void run_gemm(const LaunchCtx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C) {
  int g = g_gemm.load();
#ifdef D2L_WITH_CUDA
  if (c.backend == Backend::gpu) {
    if (g == 0) return cuda_layer::sgemm(c.blas, ta, tb, M, N, K, alpha, A, B, beta, C);
    return kernels::cuda::gemm(static_cast<kernels::cuda::Stream>(c.cuda_stream),
                               static_cast<kernels::cuda::GemmKernel>(g), ta, tb, M, N, K, alpha, A, B, beta, C);
  }
#endif
  if (c.backend == Backend::emu && g != 0)
    kernels::emu::gemm(&c.cpu, static_cast<kernels::emu::GemmKernel>(g), ta, tb, M, N, K, alpha, A, B, beta, C);
  else
    kernels::cpu::gemm(c.cpu, ta, tb, M, N, K, alpha, A, B, beta, C);
}

void run_gemm16(const LaunchCtx& c, kernels::cpu::Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const uint16_t* A, const uint16_t* B, float beta, float* C) {
  const int g = g_gemm.load();
#ifdef D2L_WITH_CUDA
  if (c.backend == Backend::gpu) {
    if (g == 0) return cuda_layer::gemm16(c.blas, f == kernels::cpu::Float16::bf16, ta, tb, M, N, K, alpha, A, B, beta, C);
    return kernels::cuda::gemm16(static_cast<kernels::cuda::Stream>(c.cuda_stream), static_cast<kernels::cuda::GemmKernel>(g),
                                 f, ta, tb, M, N, K, alpha, A, B, beta, C);
  }
#endif
  if (c.backend == Backend::emu && g != 0)
    kernels::emu::gemm16(&c.cpu, static_cast<kernels::emu::GemmKernel>(g), f, ta, tb, M, N, K, alpha, A, B, beta, C);
  else kernels::cpu::gemm16(c.cpu, f, ta, tb, M, N, K, alpha, A, B, beta, C);
}

}  // namespace d2l::detail
