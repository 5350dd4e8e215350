// Counter-based RNG (Philox4x32-10, kernels/cuda/philox.cuh): x (n) with element i drawn from the
// block for counter (offset + i) under key seed, so a value depends only on (seed, offset + i):
// the same bits as kernels/cpu/rng.cpp whatever the launch shape.
// normal: mean + stddev * N(0, 1) by Box-Muller (in double, as the CPU);  uniform: lo + (hi - lo) * U[0, 1).
// Threads: one element per thread per step of a grid-stride loop.
//
// Bit-identical to the CPU needs the same operations in the same order, rounded the same way:
// nvcc would fuse "a + b * c" into one fma (rounded once instead of twice), so the products go
// through mul_rn, which nvcc never fuses (__dmul_rn / __fmul_rn); g++ does not fuse (no -ffp-contract).
// The emulated build calls the same libm (log, cos) as the CPU: bitwise equal. On a GPU, CUDA's
// double log and cos may differ from glibc's in the last bit of the double, which changes the
// rounded float only in rare cases.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/philox.cuh"

namespace D2L_CUDA_NS {

namespace {
constexpr double kTwoPow24 = 16777216.0;
constexpr double kPi = 3.141592653589793238462643383279502884;  // std::numbers::pi

__device__ __forceinline__ double mul_rn(double a, double b) {
#ifdef __CUDA_ARCH__
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
__device__ __forceinline__ float mul_rn(float a, float b) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
}  // namespace

__global__ void normal_kernel(float* x, int64_t n, uint64_t seed, uint64_t offset, float mean, float stddev) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const PhiloxWords w = philox4x32_10(offset + static_cast<uint64_t>(i), seed);
    const double u1 = ((w.w[0] >> 8) + 1) / kTwoPow24;  // in (0, 1]: log(u1) is finite
    const double u2 = (w.w[1] >> 8) / kTwoPow24;        // in [0, 1)
    const double z = sqrt(-2.0 * log(u1)) * cos(2.0 * kPi * u2);
    x[i] = static_cast<float>(mean + mul_rn(static_cast<double>(stddev), z));
  }
}

__global__ void uniform_kernel(float* x, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const PhiloxWords w = philox4x32_10(offset + static_cast<uint64_t>(i), seed);
    const float u = static_cast<float>(w.w[0] >> 8) * (1.0f / 16777216.0f);  // 24 bits, exact, [0, 1)
    float v = lo + mul_rn(hi - lo, u);
    if (v >= hi && hi > lo) v = nextafterf(hi, lo);  // float rounding could reach hi; keep [lo, hi)
    x[i] = v;
  }
}

void normal(Stream stream, float* x, int64_t n, uint64_t seed, uint64_t offset, float mean, float stddev) {
  D2L_LAUNCH_OVER(n, stream, normal_kernel, x, n, seed, offset, mean, stddev);
}

void uniform(Stream stream, float* x, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  D2L_LAUNCH_OVER(n, stream, uniform_kernel, x, n, seed, offset, lo, hi);
}

}  // namespace D2L_CUDA_NS
