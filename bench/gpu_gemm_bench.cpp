// gpu_gemm_bench: the GEMM family of kernels/cuda/matmul.cu (naive, tiled, regblock, warptiled, tf32, mma) next to cuBLAS
// on a real GPU, then the conv2d kernels of kernels/cuda/conv2d.cu and conv2d_winograd.cu. Shapes: square 1024, 2048, 4096,
// and the im2col GEMMs of the book's LeNet and of the ResNet-18 small-image variant at batch 256
// (M = OC, N = batch*OH*OW, K = C*KH*KW: the convolution of a whole batch as one GEMM).
// 1. Validates every kernel against cuBLAS (max |C - C_cublas| / max |C_cublas|; tf32 against cuBLAS with
//    TF32 tensor cores, CUBLAS_COMPUTE_32F_FAST_TF32, within TF32's tolerance), and the conv
//    passes against each other: the im2col forward against the direct one, and the backward passes
//    by the adjoint identity <dy, y> = <dx, x> = <dw, w> (each pass is the same linear map read
//    another way). Exits 1 when one is wrong.
// 2. Times each with CUDA events: 1 warm-up, then 7 repeats of enough calls to fill ~2 ms; min and
//    median per call.
// Napkin math: a GEMM costs 2*M*N*K flops, a conv pass 2*N*OC*K*OH*OW; GFLOP/s and the ratio to
// cuBLAS (plain FP32, no TF32: the same arithmetic as ours). The targets at 4096: tiled >= 0.3x and
// regblock >= 0.6x cuBLAS, printed as met or missed (timings are never asserted); warptiled's ratio
// is printed beside them. tf32 is measured against cuBLAS TF32 (the same arithmetic as it), its
// target tf32 >= 0.5x cuBLAS TF32 at 4096.
// The 16-bit GEMMs (kernels/cuda/matmul16.cu's kernel2, matmul_mma.cu's kernel6 on mma.sync m16n8k16)
// on bfloat16 and float16 squares against cublasGemmEx on the same operands (16-bit inputs, float32
// output and sums: the same arithmetic), validated the same way; the target bf16 kernel6 >= 0.5x
// cublasGemmEx bf16 at 4096.
// Built without CUDA, or run where there is no GPU, it prints "no GPU" and exits 0.
//   gpu_gemm_bench
#include <cstdio>

#ifndef D2L_BENCH_CUDA
int main() {
  std::printf("no GPU\n");  // built without CUDA (meson option gpu disabled, or no nvcc)
  return 0;
}
#else
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "bench/bench_util.hpp"
#include "core/device.hpp"
#include "kernels/cuda/gpu.hpp"

namespace b = d2l::bench;
namespace kc = d2l::kernels::cuda;
using kc::Conv2dShape;

// Every CUDA and cuBLAS call: on failure, file:line, the call and the error string, then exit 1.
#define CHECK_CUDA(call) check_cuda((call), #call, __FILE__, __LINE__)
#define CHECK_CUBLAS(call) check_cublas((call), #call, __FILE__, __LINE__)

namespace {

void check_cuda(cudaError_t e, const char* call, const char* file, int line) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cudaGetErrorString(e));
  std::exit(1);
}
void check_cublas(cublasStatus_t s, const char* call, const char* file, int line) {
  if (s == CUBLAS_STATUS_SUCCESS) return;
  std::fprintf(stderr, "%s:%d: %s: %s\n", file, line, call, cublasGetStatusString(s));
  std::exit(1);
}

// n floats of device memory, filled from the host (or left as cudaMalloc gives them).
struct DeviceArray {
  float* p = nullptr;
  int64_t n = 0;
  explicit DeviceArray(int64_t count, uint32_t seed = 0) : n(count) {
    CHECK_CUDA(cudaMalloc(&p, bytes()));
    if (seed) CHECK_CUDA(cudaMemcpy(p, b::random_data(n, seed).data(), bytes(), cudaMemcpyHostToDevice));
  }
  ~DeviceArray() { cudaFree(p); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  size_t bytes() const { return static_cast<size_t>(n) * sizeof(float); }
  std::vector<float> host() const {
    std::vector<float> h(static_cast<size_t>(n));
    CHECK_CUDA(cudaMemcpy(h.data(), p, bytes(), cudaMemcpyDeviceToHost));
    return h;
  }
};

struct Gpu {
  cudaStream_t stream;
  cublasHandle_t blas;
};

// ---- timing with CUDA events on the stream: seconds per call
struct Stats {
  double min = 0, median = 0;
};
Stats time_gpu(const Gpu& g, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  CHECK_CUDA(cudaEventCreate(&start));
  CHECK_CUDA(cudaEventCreate(&stop));
  auto batch = [&](int calls) {  // seconds per call, over `calls` calls between two events
    CHECK_CUDA(cudaEventRecord(start, g.stream));
    for (int i = 0; i < calls; ++i) fn();
    CHECK_CUDA(cudaEventRecord(stop, g.stream));
    CHECK_CUDA(cudaEventSynchronize(stop));
    float ms = 0;
    CHECK_CUDA(cudaEventElapsedTime(&ms, start, stop));
    return 1e-3 * ms / calls;
  };
  batch(1);  // warm-up
  // A call of a few microseconds is below what one event pair resolves: time several per repeat.
  const int calls = static_cast<int>(std::clamp(2e-3 / std::max(batch(1), 1e-7), 1.0, 100.0));
  std::vector<double> t;
  for (int r = 0; r < 7; ++r) t.push_back(batch(calls));
  CHECK_CUDA(cudaEventDestroy(start));
  CHECK_CUDA(cudaEventDestroy(stop));
  return {*std::min_element(t.begin(), t.end()), b::median_of(t)};
}

// max |got - ref| / max |ref| (infinite when got holds a NaN)
double rel_error(const std::vector<float>& ref, const std::vector<float>& got) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(double(got[i]) - ref[i]);
    diff = std::isnan(d) ? INFINITY : std::max(diff, d);
    scale = std::max(scale, std::fabs(double(ref[i])));
  }
  return diff / std::max(scale, 1e-30);
}
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}
constexpr double kTolerance = 1e-3;  // float sums of up to 4608 products of values in [-1, 1)
// tf32 vs cuBLAS TF32: both round the inputs to TF32 (2^-11 relative), each element off from the exact
// product by ~sqrt(K) 2^-11 |a||b| (random roundings), ~1e-3 of max |C| at K = 4096 for the two together.
constexpr double kTf32Tolerance = 1e-2;

// ---- the shapes
struct Conv {
  const char* name;
  Conv2dShape s;  // {N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w}
  int count;      // how many times the network has this conv
  bool lenet;
};
const std::vector<Conv> kConvs = {  // conv2d_bench's shapes, all at batch 256
    {"LeNet conv1  1->20  3x3     28x28", {256, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0}, 1, true},
    {"LeNet conv2 20->50  5x5     13x13", {256, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0}, 1, true},
    {"R18 stem     1->64  3x3     28x28", {256, 1, 28, 28, 64, 3, 3, 1, 1, 1, 1}, 1, false},
    {"R18 s1      64->64  3x3     28x28", {256, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1}, 4, false},
    {"R18 s2a     64->128 3x3 /2  28x28", {256, 64, 28, 28, 128, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s2sc    64->128 1x1 /2  28x28", {256, 64, 28, 28, 128, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s2     128->128 3x3     14x14", {256, 128, 14, 14, 128, 3, 3, 1, 1, 1, 1}, 3, false},
    {"R18 s3a    128->256 3x3 /2  14x14", {256, 128, 14, 14, 256, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s3sc   128->256 1x1 /2  14x14", {256, 128, 14, 14, 256, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s3     256->256 3x3       7x7", {256, 256, 7, 7, 256, 3, 3, 1, 1, 1, 1}, 3, false},
    {"R18 s4a    256->512 3x3 /2    7x7", {256, 256, 7, 7, 512, 3, 3, 2, 2, 1, 1}, 1, false},
    {"R18 s4sc   256->512 1x1 /2    7x7", {256, 256, 7, 7, 512, 1, 1, 2, 2, 0, 0}, 1, false},
    {"R18 s4     512->512 3x3       4x4", {256, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1}, 3, false},
};
int64_t conv_k(const Conv2dShape& s) { return s.C * s.KH * s.KW; }
int64_t conv_p(const Conv2dShape& s) { return s.OH() * s.OW(); }

// ---- 1. GEMM: C (M, N) = A (M, K) @ B (K, N), row-major
const char* const kVersions[] = {"naive", "tiled", "regblock", "warptiled", "tf32", "mma", "cuBLAS", "cuBLAS_TF32"};
const kc::GemmKernel kKernels[] = {kc::GemmKernel::naive, kc::GemmKernel::tiled, kc::GemmKernel::regblock,
                                   kc::GemmKernel::warptiled, kc::GemmKernel::tf32, kc::GemmKernel::mma};
// Versions 0..5 are kKernels (4, tf32: wmma, and 5, mma: mma.sync, on tensor cores); 6 is cuBLAS (FP32), 7 cuBLAS
// with TF32 tensor cores.
constexpr int kTf32 = 4, kMma = 5, kOurs = 6, kCublas = 6, kCublasTf32 = 7;

void gemm(const Gpu& g, int version, int64_t M, int64_t N, int64_t K, const float* A, const float* B, float* C) {
  if (version < kOurs) return kc::gemm(g.stream, kKernels[version], false, false, M, N, K, 1.0f, A, B, 0.0f, C);
  // cuBLAS is column-major: row-major C = A @ B is column-major C^T = B^T @ A^T, so B goes first.
  const float alpha = 1.0f, beta = 0.0f;
  if (version == kCublasTf32) {
    CHECK_CUBLAS(cublasGemmEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, B, CUDA_R_32F, int(N), A,
                              CUDA_R_32F, int(K), &beta, C, CUDA_R_32F, int(N), CUBLAS_COMPUTE_32F_FAST_TF32,
                              CUBLAS_GEMM_DEFAULT));
    return;
  }
  CHECK_CUBLAS(cublasSgemm(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(N), int(M), int(K), &alpha, B, int(N), A, int(K), &beta,
                           C, int(N)));
}

// Validates and times the seven versions; returns each one's GFLOP/s (empty when one is wrong).
std::vector<double> bench_gemm(const Gpu& g, const char* name, int64_t M, int64_t N, int64_t K) {
  DeviceArray A(M * K, 1), B(K * N, 2), C(M * N), C_ref(M * N);
  gemm(g, kCublas, M, N, K, A.p, B.p, C_ref.p);
  const std::vector<float> ref = C_ref.host();
  gemm(g, kCublasTf32, M, N, K, A.p, B.p, C_ref.p);
  const std::vector<float> ref_tf32 = C_ref.host();
  double worst = 0, worst_tf32 = 0;
  for (int v = 0; v < kOurs; ++v) {
    CHECK_CUDA(cudaMemset(C.p, 0xff, C.bytes()));  // NaNs: an element the kernel skips shows
    gemm(g, v, M, N, K, A.p, B.p, C.p);
    const bool tf32 = v == kTf32 || v == kMma;
    const double err = rel_error(tf32 ? ref_tf32 : ref, C.host());
    (tf32 ? worst_tf32 : worst) = std::max(tf32 ? worst_tf32 : worst, err);
    if (!(err <= (tf32 ? kTf32Tolerance : kTolerance))) {
      std::printf("  validation FAILED: %s on %s (%lld x %lld x %lld): max error %.2e relative to max |C|\n",
                  kVersions[v], name, (long long)M, (long long)N, (long long)K, err);
      return {};
    }
  }
  std::vector<double> gflops;
  for (int v = 0; v <= kCublasTf32; ++v) {
    const Stats t = time_gpu(g, [&] { gemm(g, v, M, N, K, A.p, B.p, C.p); });
    gflops.push_back(2.0 * double(M) * double(N) * double(K) / t.min / 1e9);
  }
  const double cublas = gflops[kCublas], cublas_tf32 = gflops[kCublasTf32];
  std::printf("%-34s %5lld %7lld %5lld | %8.0f %8.0f %8.0f %9.0f %8.0f | %5.2fx %5.2fx %5.2fx %5.2fx | %.1e | %8.0f %8.0f "
              "%8.0f %6.2fx %6.2fx | %.1e\n",
              name, (long long)M, (long long)N, (long long)K, gflops[0], gflops[1], gflops[2], gflops[3], cublas,
              gflops[0] / cublas, gflops[1] / cublas, gflops[2] / cublas, gflops[3] / cublas, worst, gflops[kTf32],
              gflops[kMma], cublas_tf32, gflops[kTf32] / cublas_tf32, gflops[kMma] / cublas_tf32, worst_tf32);
  return gflops;
}

// ---- 1b. the 16-bit GEMMs: C (M, N) float32 = A @ B with A and B bfloat16 or float16, row-major
struct DeviceArray16 {
  uint16_t* p = nullptr;
  DeviceArray16(int64_t n, uint32_t seed, kc::Float16 f) {
    std::vector<uint16_t> h;
    for (float v : b::random_data(n, seed))
      h.push_back(f == kc::Float16::bf16 ? d2l::kernels::cpu::bf16_from_float(v) : d2l::kernels::cpu::f16_from_float(v));
    CHECK_CUDA(cudaMalloc(&p, h.size() * 2));
    CHECK_CUDA(cudaMemcpy(p, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  }
  ~DeviceArray16() { cudaFree(p); }
  DeviceArray16(const DeviceArray16&) = delete;
  DeviceArray16& operator=(const DeviceArray16&) = delete;
};

const char* const kVersions16[] = {"tiled", "mma", "cuBLAS"};  // kernel2, kernel6, cublasGemmEx

void gemm16(const Gpu& g, int version, kc::Float16 f, int64_t n, const uint16_t* A, const uint16_t* B, float* C) {
  if (version < 2)
    return kc::gemm16(g.stream, version == 0 ? kc::GemmKernel::tiled : kc::GemmKernel::mma, f, false, false, n, n, n, 1.0f, A,
                      B, 0.0f, C);
  const float alpha = 1.0f, beta = 0.0f;
  const cudaDataType_t t = f == kc::Float16::bf16 ? CUDA_R_16BF : CUDA_R_16F;
  CHECK_CUBLAS(cublasGemmEx(g.blas, CUBLAS_OP_N, CUBLAS_OP_N, int(n), int(n), int(n), &alpha, B, t, int(n), A, t, int(n), &beta,
                            C, CUDA_R_32F, int(n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Validates kernel2 and kernel6 against cublasGemmEx and times the three; their GFLOP/s (empty when one is wrong).
std::vector<double> bench_gemm16(const Gpu& g, kc::Float16 f, int64_t n) {
  const char* type = f == kc::Float16::bf16 ? "bf16" : "f16";
  DeviceArray16 A(n * n, 1, f), B(n * n, 2, f);
  DeviceArray C(n * n), C_ref(n * n);
  gemm16(g, 2, f, n, A.p, B.p, C_ref.p);
  const std::vector<float> ref = C_ref.host();
  double worst = 0;
  for (int v = 0; v < 2; ++v) {
    CHECK_CUDA(cudaMemset(C.p, 0xff, C.bytes()));
    gemm16(g, v, f, n, A.p, B.p, C.p);
    const double err = rel_error(ref, C.host());
    worst = std::max(worst, err);
    if (!(err <= kTolerance)) {
      std::printf("  validation FAILED: %s %s on square %lld: max error %.2e relative to max |C|\n", type, kVersions16[v],
                  (long long)n, err);
      return {};
    }
  }
  std::vector<double> gflops;
  for (int v = 0; v < 3; ++v) {
    const Stats t = time_gpu(g, [&] { gemm16(g, v, f, n, A.p, B.p, C.p); });
    gflops.push_back(2.0 * double(n) * double(n) * double(n) / t.min / 1e9);
  }
  std::printf("%-6s square %5lld | %9.0f %9.0f %12.0f | %6.2fx %6.2fx | %.1e\n", type, (long long)n, gflops[0], gflops[1], gflops[2],
              gflops[0] / gflops[2], gflops[1] / gflops[2], worst);
  return gflops;
}

// ---- 2. conv2d: forward (im2col + tiled GEMM), direct forward, backward_data, backward_weight, kernel5's
// three passes in its fp32 and tf32 variants, and kernel3 F(4x4, 3x3) forward and backward_data where it
// fits (3x3 stride 1; backward_data pad <= 2)
struct ConvTimes {
  Stats fwd, direct, data, weight;
  bool wino_fwd = false, wino_data = false;  // kernel3 fits: then wfwd, wdata are its times
  Stats wfwd, wdata;
  Stats ifwd, idata, iweight;  // kernel5, implicit GEMM, fp32 variant: every shape
  Stats tfwd, tdata, tweight;  // kernel5's tf32 variant (tensor cores)
  double t64 = 0, t128 = 0;     // its three passes' ms with 64x64 and with 128x128 tiles forced
  double mma = 0;               // its three passes' ms on the mma core (mma.sync, cp.async), the launcher's tiles
};
constexpr double kTf32ConvTolerance = 5e-3;  // TF32 inputs (10-bit mantissa): ~1e-4 relative to max |C| here
bool bench_conv(const Gpu& g, const Conv& c, ConvTimes& t) {
  const Conv2dShape& s = c.s;
  const int64_t nx = s.N * s.C * s.H * s.W, nw = s.OC * conv_k(s), ny = s.N * s.OC * conv_p(s);
  DeviceArray x(nx, 4), w(nw, 5), dy(ny, 6), y(ny), y_direct(ny), dx(nx), dw(nw);
  // The reference passes and the first columns: kernel2, im2col (conv2d_forward and the backward passes
  // run the member set_conv2d_kernel chose; automatic would be kernel5 in TF32 on this GPU).
  d2l::kernels::cpu::set_conv2d_kernel(d2l::kernels::cpu::Conv2dKernel::im2col);
  for (const DeviceArray* out : {&y, &y_direct, &dx, &dw}) CHECK_CUDA(cudaMemset(out->p, 0xff, out->bytes()));  // NaNs
  kc::conv2d_forward(g.stream, s, x.p, w.p, y.p);
  kc::conv2d_forward_direct(g.stream, s, x.p, w.p, y_direct.p);
  kc::conv2d_backward_data(g.stream, s, dy.p, w.p, dx.p);
  kc::conv2d_backward_weight(g.stream, s, x.p, dy.p, dw.p);
  const std::vector<float> hy = y.host(), hdy = dy.host();
  const double direct_err = rel_error(hy, y_direct.host());
  const double dy_y = dot(hdy, hy), dx_x = dot(dx.host(), x.host()), dw_w = dot(dw.host(), w.host());
  const double adjoint_err = std::max(std::fabs(dx_x - dy_y), std::fabs(dw_w - dy_y)) / std::fabs(dy_y);
  if (!(direct_err <= kTolerance && adjoint_err <= kTolerance)) {
    std::printf("  validation FAILED: %s: direct vs im2col forward %.2e; <dy,y> %.6g, <dx,x> %.6g, <dw,w> %.6g\n", c.name,
                direct_err, dy_y, dx_x, dw_w);
    return false;
  }
  // kernel3 F(4x4, 3x3): against the im2col passes (its float error is ~30x im2col's: still far inside)
  t.wino_fwd = d2l::kernels::cpu::conv2d_winograd_fits(s);
  t.wino_data = t.wino_fwd && s.pad_h <= 2 && s.pad_w <= 2;
  DeviceArray wy(t.wino_fwd ? ny : 0), wdx(t.wino_data ? nx : 0);
  if (t.wino_fwd) {
    CHECK_CUDA(cudaMemset(wy.p, 0xff, wy.bytes()));
    kc::conv2d_forward_winograd(g.stream, s, x.p, w.p, wy.p);
    const double err = rel_error(hy, wy.host());
    double derr = 0;
    if (t.wino_data) {
      CHECK_CUDA(cudaMemset(wdx.p, 0xff, wdx.bytes()));
      kc::conv2d_backward_data_winograd(g.stream, s, dy.p, w.p, wdx.p);
      derr = rel_error(dx.host(), wdx.host());
    }
    if (!(err <= kTolerance && derr <= kTolerance)) {
      std::printf("  validation FAILED: %s: winograd vs im2col: forward %.2e, backward_data %.2e\n", c.name, err, derr);
      return false;
    }
    t.wfwd = time_gpu(g, [&] { kc::conv2d_forward_winograd(g.stream, s, x.p, w.p, wy.p); });
    if (t.wino_data) t.wdata = time_gpu(g, [&] { kc::conv2d_backward_data_winograd(g.stream, s, dy.p, w.p, wdx.p); });
  }
  // kernel5, implicit GEMM: its three passes against the ones above, in each precision (fp32: the SIMT
  // variant; tf32: the tensor cores' one, to TF32's tolerance), then timed.
  namespace kcpu = d2l::kernels::cpu;
  DeviceArray iy(ny), idx(nx), idw(nw);
  for (kcpu::Precision p : {kcpu::Precision::fp32, kcpu::Precision::tf32}) {
    kcpu::set_precision(p);
    for (const DeviceArray* out : {&iy, &idx, &idw}) CHECK_CUDA(cudaMemset(out->p, 0xff, out->bytes()));
    kc::conv2d_forward_implicit(g.stream, s, x.p, w.p, iy.p);
    kc::conv2d_backward_data_implicit(g.stream, s, dy.p, w.p, idx.p);
    kc::conv2d_backward_weight_implicit(g.stream, s, x.p, dy.p, idw.p);
    const double ierr = std::max({rel_error(hy, iy.host()), rel_error(dx.host(), idx.host()), rel_error(dw.host(), idw.host())});
    const bool tf32 = p == kcpu::Precision::tf32;
    if (!(ierr <= (tf32 ? kTf32ConvTolerance : kTolerance))) {
      std::printf("  validation FAILED: %s: implicit GEMM (%s) vs the passes above: %.2e\n", c.name, tf32 ? "tf32" : "fp32",
                  ierr);
      kcpu::set_precision(kcpu::Precision::automatic);
      return false;
    }
    (tf32 ? t.tfwd : t.ifwd) = time_gpu(g, [&] { kc::conv2d_forward_implicit(g.stream, s, x.p, w.p, iy.p); });
    (tf32 ? t.tdata : t.idata) = time_gpu(g, [&] { kc::conv2d_backward_data_implicit(g.stream, s, dy.p, w.p, idx.p); });
    (tf32 ? t.tweight : t.iweight) = time_gpu(g, [&] { kc::conv2d_backward_weight_implicit(g.stream, s, x.p, dy.p, idw.p); });
  }
  // kernel5 tf32 with each tile size forced (kc::set_conv2d_implicit_tile): the launcher's rule against both.
  for (int tile : {64, 128}) {
    kc::set_conv2d_implicit_tile(tile);
    (tile == 64 ? t.t64 : t.t128) =
        1e3 * (time_gpu(g, [&] { kc::conv2d_forward_implicit(g.stream, s, x.p, w.p, iy.p); }).min +
               time_gpu(g, [&] { kc::conv2d_backward_data_implicit(g.stream, s, dy.p, w.p, idx.p); }).min +
               time_gpu(g, [&] { kc::conv2d_backward_weight_implicit(g.stream, s, x.p, dy.p, idw.p); }).min);
  }
  kc::set_conv2d_implicit_tile(0);
  // kernel5 tf32 on the mma core (kc::set_conv2d_implicit_core): checked against the passes above, then timed.
  kc::set_conv2d_implicit_core(kc::ImplicitCore::mma);
  for (const DeviceArray* out : {&iy, &idx, &idw}) CHECK_CUDA(cudaMemset(out->p, 0xff, out->bytes()));
  kc::conv2d_forward_implicit(g.stream, s, x.p, w.p, iy.p);
  kc::conv2d_backward_data_implicit(g.stream, s, dy.p, w.p, idx.p);
  kc::conv2d_backward_weight_implicit(g.stream, s, x.p, dy.p, idw.p);
  const double merr = std::max({rel_error(hy, iy.host()), rel_error(dx.host(), idx.host()), rel_error(dw.host(), idw.host())});
  if (!(merr <= kTf32ConvTolerance)) {
    std::printf("  validation FAILED: %s: implicit GEMM (tf32, mma core) vs the passes above: %.2e\n", c.name, merr);
    kc::set_conv2d_implicit_core(kc::ImplicitCore::wmma);
    kcpu::set_precision(kcpu::Precision::automatic);
    return false;
  }
  t.mma = 1e3 * (time_gpu(g, [&] { kc::conv2d_forward_implicit(g.stream, s, x.p, w.p, iy.p); }).min +
                 time_gpu(g, [&] { kc::conv2d_backward_data_implicit(g.stream, s, dy.p, w.p, idx.p); }).min +
                 time_gpu(g, [&] { kc::conv2d_backward_weight_implicit(g.stream, s, x.p, dy.p, idw.p); }).min);
  kc::set_conv2d_implicit_core(kc::ImplicitCore::wmma);
  kcpu::set_precision(kcpu::Precision::automatic);
  t.fwd = time_gpu(g, [&] { kc::conv2d_forward(g.stream, s, x.p, w.p, y.p); });
  t.direct = time_gpu(g, [&] { kc::conv2d_forward_direct(g.stream, s, x.p, w.p, y_direct.p); });
  t.data = time_gpu(g, [&] { kc::conv2d_backward_data(g.stream, s, dy.p, w.p, dx.p); });
  t.weight = time_gpu(g, [&] { kc::conv2d_backward_weight(g.stream, s, x.p, dy.p, dw.p); });
  d2l::kernels::cpu::set_conv2d_kernel(d2l::kernels::cpu::Conv2dKernel::automatic);
  return true;
}

int run() {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaSetDevice(0));
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  Gpu g{};
  CHECK_CUDA(cudaStreamCreate(&g.stream));
  CHECK_CUBLAS(cublasCreate(&g.blas));
  CHECK_CUBLAS(cublasSetStream(g.blas, g.stream));
  CHECK_CUBLAS(cublasSetMathMode(g.blas, CUBLAS_DEFAULT_MATH));  // FP32 sgemm, no TF32 tensor cores
  int blas_version = 0;
  CHECK_CUBLAS(cublasGetVersion(g.blas, &blas_version));
  std::printf("gpu_gemm_bench: kernels/cuda GEMMs and conv2d vs cuBLAS %d on gpu(0) = %s (sm_%d%d, %d SMs, %.0f GiB)\n\n",
              blas_version, prop.name, prop.major, prop.minor, prop.multiProcessorCount,
              double(prop.totalGlobalMem) / (1 << 30));

  std::printf("%-34s %5s %7s %5s | %8s %8s %8s %9s %8s | %-27s | %-7s | %8s %8s %8s %15s | %s\n", "GEMM (conv: batch 256)",
              "M", "N", "K", "naive", "tiled", "regblock", "warptiled", "cuBLAS", "ratio to cuBLAS", "max err", "tf32", "mma",
              "cuBLAS", "ratio to TF32", "max err");
  std::printf("%-34s %5s %7s %5s | %8s %8s %8s %9s %8s | %6s %6s %6s %6s | %-7s | %8s %8s %8s %7s %7s | %s\n", "", "", "", "",
              "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "naive", "tiled", "regblk", "warp", "vs FP32", "GFLOP/s",
              "GFLOP/s", "TF32", "tf32", "mma", "vs TF32");
  std::vector<double> at4096;
  for (int64_t n : {1024, 2048, 4096}) {
    const std::string name = "square " + std::to_string(n);
    at4096 = bench_gemm(g, name.c_str(), n, n, n);
    if (at4096.empty()) return 1;
  }
  for (const Conv& c : kConvs)
    if (bench_gemm(g, c.name, c.s.OC, c.s.N * conv_p(c.s), conv_k(c.s)).empty()) return 1;
  const double tiled = at4096[1] / at4096[kCublas], regblock = at4096[2] / at4096[kCublas];
  std::printf("\ntargets at 4096: tiled %.2fx cuBLAS (target >= 0.3x): %s; regblock %.2fx cuBLAS (target >= 0.6x): %s\n",
              tiled, tiled >= 0.3 ? "met" : "missed", regblock, regblock >= 0.6 ? "met" : "missed");
  std::printf("warptiled at 4096: %.2fx cuBLAS\n", at4096[3] / at4096[kCublas]);
  for (int v : {kTf32, kMma}) {
    const double r = at4096[v] / at4096[kCublasTf32];
    std::printf("%s >= 0.5x cuBLAS TF32 at 4096: %s (%.2fx; %.0f vs %.0f GFLOP/s)\n", kVersions[v], r >= 0.5 ? "met" : "missed",
                r, at4096[v], at4096[kCublasTf32]);
  }
  for (int v = 0; v <= kCublasTf32; ++v) b::result(std::string("gpu_gemm4096_gflops_") + kVersions[v], at4096[v]);

  std::printf("\n%-19s | %9s %9s %12s | %-15s | %s\n", "16-bit GEMM", "kernel2", "kernel6", "cublasGemmEx", "ratio to cuBLAS",
              "max err");
  std::printf("%-19s | %9s %9s %12s | %7s %7s | %s\n", "", "GFLOP/s", "GFLOP/s", "GFLOP/s", "tiled", "mma", "vs cuBLAS");
  for (kc::Float16 f : {kc::Float16::bf16, kc::Float16::f16}) {
    std::vector<double> r16;
    for (int64_t n : {1024, 2048, 4096}) {
      r16 = bench_gemm16(g, f, n);
      if (r16.empty()) return 1;
    }
    const std::string type = f == kc::Float16::bf16 ? "bf16" : "f16";
    for (int v = 0; v < 3; ++v) b::result("gpu_gemm16_4096_gflops_" + type + "_" + kVersions16[v], r16[v]);
    if (f == kc::Float16::bf16)
      std::printf("bf16 kernel6 (mma) >= 0.5x cublasGemmEx bf16 at 4096: %s (%.2fx; %.0f vs %.0f GFLOP/s)\n",
                  r16[1] >= 0.5 * r16[2] ? "met" : "missed", r16[1] / r16[2], r16[1], r16[2]);
  }

  std::printf("\n%-34s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s | %9s %9s %9s %9s\n", "conv2d, batch 256", "fwd",
              "direct", "bwd_data", "bwd_wt", "wino fwd", "wino bwd", "impl fwd", "impl bwd", "impl wt", "i32 fwd", "i32 bwd",
              "i32 wt", "fwd+bwd", "fwd+bwd", "impl", "i32");
  std::printf("%-34s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s %8s | %9s %9s %9s %9s\n", "", "GFLOP/s", "GFLOP/s", "GFLOP/s",
              "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "GFLOP/s", "min ms", "med ms",
              "min ms", "min ms");
  double lenet_ms = 0, r18_ms = 0, lenet_wino_ms = 0, r18_wino_ms = 0, lenet_impl_ms = 0, r18_impl_ms = 0;
  double lenet_tf32_ms = 0, r18_tf32_ms = 0, r18_t64_ms = 0, r18_t128_ms = 0, r18_mma_ms = 0;
  for (const Conv& c : kConvs) {
    ConvTimes t;
    if (!bench_conv(g, c, t)) return 1;
    const double f = 2.0 * double(c.s.N * c.s.OC * conv_k(c.s) * conv_p(c.s));
    const double min_ms = 1e3 * (t.fwd.min + t.data.min + t.weight.min);
    char wf[16] = "-", wd[16] = "-";  // kernel3's columns: '-' where it does not fit
    if (t.wino_fwd) std::snprintf(wf, sizeof wf, "%.0f", f / t.wfwd.min / 1e9);
    if (t.wino_data) std::snprintf(wd, sizeof wd, "%.0f", f / t.wdata.min / 1e9);
    const double impl_ms = 1e3 * (t.ifwd.min + t.idata.min + t.iweight.min);
    const double tf32_ms = 1e3 * (t.tfwd.min + t.tdata.min + t.tweight.min);
    std::printf("%-34s %8.0f %8.0f %8.0f %8.0f %8s %8s %8.0f %8.0f %8.0f %8.0f %8.0f %8.0f | %9.3f %9.3f %9.3f %9.3f\n", c.name,
                f / t.fwd.min / 1e9, f / t.direct.min / 1e9, f / t.data.min / 1e9, f / t.weight.min / 1e9, wf, wd,
                f / t.ifwd.min / 1e9, f / t.idata.min / 1e9, f / t.iweight.min / 1e9, f / t.tfwd.min / 1e9,
                f / t.tdata.min / 1e9, f / t.tweight.min / 1e9, min_ms, 1e3 * (t.fwd.median + t.data.median + t.weight.median),
                impl_ms, tf32_ms);
    (c.lenet ? lenet_impl_ms : r18_impl_ms) += c.count * impl_ms;
    (c.lenet ? lenet_tf32_ms : r18_tf32_ms) += c.count * tf32_ms;
    if (!c.lenet) r18_t64_ms += c.count * t.t64, r18_t128_ms += c.count * t.t128, r18_mma_ms += c.count * t.mma;
    (c.lenet ? lenet_ms : r18_ms) += c.count * min_ms;
    const double wino_ms = 1e3 * ((t.wino_fwd ? t.wfwd.min : t.fwd.min) + (t.wino_data ? t.wdata.min : t.data.min) +
                                  t.weight.min);
    (c.lenet ? lenet_wino_ms : r18_wino_ms) += c.count * wino_ms;
  }
  std::printf("  fwd = im2col + tiled GEMM per image; direct = one thread per output; fwd+bwd = fwd + bwd_data + bwd_wt\n");
  std::printf("  wino = kernel3 winograd F(4x4, 3x3) with the tiled GEMMs (3x3 stride 1 only; GFLOP/s of the direct\n"
              "  convolution's 2*N*OC*C*9*OH*OW flops, so above the GEMM's own rate when it saves work)\n");
  std::printf("  all convs of a batch-256 training step with im2col: LeNet %.2f ms, ResNet-18 %.2f ms\n", lenet_ms, r18_ms);
  std::printf("  all convs of a batch-256 training step with winograd where it fits: LeNet %.2f ms, ResNet-18 %.2f ms\n",
              lenet_wino_ms, r18_wino_ms);
  b::result("gpu_conv_lenet_step_ms", lenet_ms);
  b::result("gpu_conv_resnet18_step_ms", r18_ms);
  b::result("gpu_conv_lenet_step_winograd_ms", lenet_wino_ms);
  b::result("gpu_conv_resnet18_step_winograd_ms", r18_wino_ms);
  std::printf("  impl = kernel5, implicit GEMM: each pass one GEMM over the whole batch (kernels/cuda/conv2d_implicit.cu), fp32\n"
              "  variant (SIMT); i32 = its tf32 variant (tensor cores, TF32 inputs, FP32 sums); impl, i32 ms = fwd+bwd\n");
  std::printf("  all convs of a batch-256 training step with kernel5 fp32: LeNet %.2f ms, ResNet-18 %.2f ms\n", lenet_impl_ms,
              r18_impl_ms);
  std::printf("  all convs of a batch-256 training step with kernel5 tf32: LeNet %.2f ms, ResNet-18 %.2f ms\n", lenet_tf32_ms,
              r18_tf32_ms);
  std::printf("  ResNet-18 step: im2col %.2f ms, winograd %.2f ms, kernel5 fp32 %.2f ms, kernel5 tf32 %.2f ms\n", r18_ms,
              r18_wino_ms, r18_impl_ms, r18_tf32_ms);
  std::printf("  kernel5 tf32 with its tiles forced: ResNet-18 %.2f ms at 64x64, %.2f ms at 128x128 (the launcher's rule: %.2f ms)\n",
              r18_t64_ms, r18_t128_ms, r18_tf32_ms);
  std::printf("  kernel5 tf32 on the mma core (mma.sync, cp.async pipelines): ResNet-18 %.2f ms (wmma core: %.2f ms; ratio %.2f)\n",
              r18_mma_ms, r18_tf32_ms, r18_mma_ms / r18_tf32_ms);
  const double r18_best = std::min({r18_ms, r18_wino_ms, r18_impl_ms, r18_tf32_ms, r18_mma_ms});
  std::printf("target: all convs of the ResNet-18 batch-256 step <= 40 ms: %s (best %.2f ms)\n",
              r18_best <= 40.0 ? "met" : "missed", r18_best);
  b::result("gpu_conv_lenet_step_implicit_ms", lenet_impl_ms);
  b::result("gpu_conv_resnet18_step_implicit_ms", r18_impl_ms);
  b::result("gpu_conv_lenet_step_implicit_tf32_ms", lenet_tf32_ms);
  b::result("gpu_conv_resnet18_step_implicit_tf32_ms", r18_tf32_ms);
  b::result("gpu_conv_resnet18_step_implicit_mma_ms", r18_mma_ms);

  CHECK_CUBLAS(cublasDestroy(g.blas));
  CHECK_CUDA(cudaStreamDestroy(g.stream));
  return 0;
}

}  // namespace

int main() {
  if (d2l::num_gpus() == 0) {  // no driver, no device, or a CUDA runtime that cannot use it
    std::printf("no GPU\n");
    return 0;
  }
  try {
    return run();
  } catch (const std::exception& e) {  // a kernel launch that failed (kernels/cuda launchers throw)
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
#endif
