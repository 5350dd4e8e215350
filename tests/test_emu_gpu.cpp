// kernels/cuda/matmul.cu built twice into one binary: the nvcc build on a real GPU against the
// g++ build on the emulation and a double loop. Built only with nvcc; without a GPU (here
// cudaGetDeviceCount fails with error 35) it reports "skipped" (exit 77) instead of passing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdio>
#include <vector>

#include "check.hpp"
#include "kernels/cuda/gpu.hpp"
#include "kernels/emu/kernels.hpp"

namespace gpu = d2l::kernels::cuda;
namespace kemu = d2l::kernels::emu;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) FAIL(what << ": " << cudaGetErrorString(e));
}

// Device copy of a host vector, freed at scope end.
struct DeviceBuffer {
  float* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(const std::vector<float>& h) : n(h.size()) {
    cuda_check(cudaMalloc(&p, (n ? n : 1) * sizeof(float)), "cudaMalloc");
    cuda_check(cudaMemcpy(p, h.data(), n * sizeof(float), cudaMemcpyHostToDevice), "cudaMemcpy to device");
  }
  std::vector<float> to_host() const {
    std::vector<float> h(n);
    cuda_check(cudaMemcpy(h.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy to host");
    return h;
  }
  ~DeviceBuffer() { cudaFree(p); }
};

using d2l::test::ref_gemm;

}  // namespace

TEST_CASE("nvcc-built GEMM kernels on the GPU match their emulated twins and a double loop") {
  struct Shape {
    int64_t M, N, K;
  };
  const Shape shapes[] = {{1, 1, 1}, {17, 33, 9}, {65, 31, 70}, {130, 200, 129}, {132, 260, 36}};
  const gpu::GemmKernel gk[] = {gpu::GemmKernel::naive, gpu::GemmKernel::tiled, gpu::GemmKernel::regblock,
                                gpu::GemmKernel::warptiled, gpu::GemmKernel::tf32, gpu::GemmKernel::mma};
  const kemu::GemmKernel ek[] = {kemu::GemmKernel::naive, kemu::GemmKernel::tiled, kemu::GemmKernel::regblock,
                                 kemu::GemmKernel::warptiled, kemu::GemmKernel::tf32, kemu::GemmKernel::mma};
  uint32_t seed = 1;
  int failures = 0;
  for (int v = 0; v < 5; ++v)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const Shape& s : shapes) {
          auto A = lcg_data(s.M * s.K, seed), B = lcg_data(s.K * s.N, seed + 1), C0 = lcg_data(s.M * s.N, seed + 2);
          seed += 3;
          DeviceBuffer dA(A), dB(B), dC(C0);
          gpu::gemm(nullptr, gk[v], ta, tb, s.M, s.N, s.K, 0.5f, dA.p, dB.p, 2.0f, dC.p);
          cuda_check(cudaDeviceSynchronize(), "gemm on the GPU");
          auto Cgpu = dC.to_host(), Cemu = C0;
          kemu::gemm(nullptr, ek[v], ta, tb, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f, Cemu.data());
          auto ref = ref_gemm(ta, tb, s.M, s.N, s.K, 0.5, A, B, 2.0, C0);
          const double atol = 1e-5 * static_cast<double>(s.K + 1);  // float accumulation of K terms
          if (gk[v] == gpu::GemmKernel::tf32 || gk[v] == gpu::GemmKernel::mma) {
            // Both round the same inputs to TF32; only the order of the FP32 sums may differ. Against
            // double: TF32's bound for |alpha| = 0.5 and sum |a||b| <= K, (K + 2) 2^-11 * 0.5 K.
            const double tf32 = (s.K + 2) * std::ldexp(1.0, -11) * 0.5 * s.K;
            failures += !close(ref, Cgpu, tf32, 0.0, "gpu tf32 vs double");
            failures += !close(Cemu, Cgpu, 2 * atol, 2e-5, "gpu tf32 vs emu");
          } else {
            failures += !close(ref, Cgpu, atol, 1e-5, "gpu vs double");
            failures += !close(Cemu, Cgpu, 2 * atol, 2e-5, "gpu vs emu");
          }
        }
  CHECK(failures == 0);
}

int main(int argc, char** argv) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("no GPU (cudaGetDeviceCount: %s): skipped\n", e != cudaSuccess ? cudaGetErrorString(e) : "0 devices");
    return 77;  // meson: skipped
  }
  doctest::Context context(argc, argv);
  return context.run();
}
