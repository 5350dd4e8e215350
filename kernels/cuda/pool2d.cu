// 2-D max and average pooling, and global average pooling: the CUDA twin of kernels/cpu/pool2d.cpp.
//   x (N, C, H, W) -> y (N, C, OH, OW), OH = (H + 2*pad_h - KH) / stride_h + 1, OW likewise.
// Output (oh, ow) looks at the window of input rows oh*stride_h - pad_h + [0, KH) and columns
// ow*stride_w - pad_w + [0, KW); positions outside the image are padding.
//   max: y = the largest value in the window; padding never wins; argmax (N, C, OH, OW) int32 keeps
//        the winner's flat index h*W + w in its (n, c) plane (first on ties; a NaN wins). A window of
//        padding only gives y = 0, argmax -1.  backward: dx[argmax] += dy.
//   avg: y = (sum of the window's image values) / (KH*KW): padding counts as zeros.
//        backward: each image position of the window gets dy / (KH*KW).
//   global avg: x (N, C, HW) -> y (N, C) = mean over HW; backward dx = dy / HW.
// Forward: one thread per output element. Backward: one thread per INPUT element, which gathers
// from the windows that contain it: no two threads write the same dx, so no atomics, and the
// additions happen in one fixed order (windows in increasing output index): the same bits every run.
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/reduce.cuh"

namespace D2L_CUDA_NS {

// The output rows whose windows contain input row ih: oh in [begin, end). A window starts at
// oh*stride - pad and holds K rows, so it contains ih when ih - K < oh*stride - pad <= ih.
struct OutRange {
  int64_t begin, end;
};
__device__ __forceinline__ OutRange windows_containing(int64_t ih, int64_t K, int64_t stride, int64_t pad,
                                                       int64_t OH) {
  const int64_t begin = ih + pad < K ? 0 : (ih + pad - K) / stride + 1;
  const int64_t last = (ih + pad) / stride + 1;
  return {begin, last < OH ? last : OH};
}

// ---- max pooling. Forward threads: element o = (p * OH + oh) * OW + ow of y, p = n * C + c.
__global__ void max_pool2d_forward_kernel(Pool2dShape s, int64_t OH, int64_t OW, const float* __restrict__ x,
                                          float* __restrict__ y, int32_t* __restrict__ argmax) {
  const int64_t total = s.N * s.C * OH * OW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % OW, oh = o / OW % OH, p = o / (OW * OH);
    const float* xp = x + p * s.H * s.W;
    const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
    const int64_t h_end = h0 + s.KH < s.H ? h0 + s.KH : s.H, w_end = w0 + s.KW < s.W ? w0 + s.KW : s.W;
    float best = 0.0f;
    int64_t best_i = -1;
    for (int64_t ih = h0 > 0 ? h0 : 0; ih < h_end; ++ih)
      for (int64_t iw = w0 > 0 ? w0 : 0; iw < w_end; ++iw) {
        const float v = xp[ih * s.W + iw];
        // strictly greater: the first maximum wins ties; the first NaN wins over numbers
        if (best_i < 0 || v > best || (isnan(v) && !isnan(best))) {
          best = v;
          best_i = ih * s.W + iw;
        }
      }
    y[o] = best;
    argmax[o] = static_cast<int32_t>(best_i);
  }
}

// Backward threads: element i = p * H * W + ih * W + iw of dx.
__global__ void max_pool2d_backward_kernel(Pool2dShape s, int64_t OH, int64_t OW, const float* __restrict__ dy,
                                           const int32_t* __restrict__ argmax, float* __restrict__ dx) {
  const int64_t total = s.N * s.C * s.H * s.W, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t iw = i % s.W, ih = i / s.W % s.H, p = i / (s.W * s.H);
    const OutRange rows = windows_containing(ih, s.KH, s.stride_h, s.pad_h, OH);
    const OutRange cols = windows_containing(iw, s.KW, s.stride_w, s.pad_w, OW);
    const int32_t me = static_cast<int32_t>(ih * s.W + iw);
    float g = 0.0f;
    for (int64_t oh = rows.begin; oh < rows.end; ++oh)
      for (int64_t ow = cols.begin; ow < cols.end; ++ow) {
        const int64_t o = (p * OH + oh) * OW + ow;
        if (argmax[o] == me) g += dy[o];  // this window's maximum was me
      }
    dx[i] = g;
  }
}

// ---- average pooling (padding counted: always divide by KH*KW). Threads as for max pooling.
__global__ void avg_pool2d_forward_kernel(Pool2dShape s, int64_t OH, int64_t OW, const float* __restrict__ x,
                                          float* __restrict__ y) {
  const float inv_area = 1.0f / static_cast<float>(s.KH * s.KW);
  const int64_t total = s.N * s.C * OH * OW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % OW, oh = o / OW % OH, p = o / (OW * OH);
    const float* xp = x + p * s.H * s.W;
    const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
    const int64_t h_end = h0 + s.KH < s.H ? h0 + s.KH : s.H, w_end = w0 + s.KW < s.W ? w0 + s.KW : s.W;
    float sum = 0.0f;
    for (int64_t ih = h0 > 0 ? h0 : 0; ih < h_end; ++ih)
      for (int64_t iw = w0 > 0 ? w0 : 0; iw < w_end; ++iw) sum += xp[ih * s.W + iw];
    y[o] = sum * inv_area;
  }
}

__global__ void avg_pool2d_backward_kernel(Pool2dShape s, int64_t OH, int64_t OW, const float* __restrict__ dy,
                                           float* __restrict__ dx) {
  const float inv_area = 1.0f / static_cast<float>(s.KH * s.KW);
  const int64_t total = s.N * s.C * s.H * s.W, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t iw = i % s.W, ih = i / s.W % s.H, p = i / (s.W * s.H);
    const OutRange rows = windows_containing(ih, s.KH, s.stride_h, s.pad_h, OH);
    const OutRange cols = windows_containing(iw, s.KW, s.stride_w, s.pad_w, OW);
    float g = 0.0f;
    for (int64_t oh = rows.begin; oh < rows.end; ++oh)
      for (int64_t ow = cols.begin; ow < cols.end; ++ow) g += dy[(p * OH + oh) * OW + ow] * inv_area;
    dx[i] = g;
  }
}

// ---- global average pooling: x (N, C, HW) -> y (N, C).
// Forward threads: one warp per plane p (8 per block, grid-stride); lanes stride over its HW values.
__global__ void global_avg_pool_forward_kernel(int64_t planes, int64_t HW, const float* __restrict__ x,
                                               float* __restrict__ y) {
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_block = blockDim.x / 32, warps = int64_t(gridDim.x) * warps_per_block;
  for (int64_t p = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32; p < planes; p += warps) {
    double sum = 0.0;
    for (int64_t i = lane; i < HW; i += 32) sum += x[p * HW + i];
    sum = warp_sum(sum);  // lane 0 holds the plane's total
    if (lane == 0) y[p] = static_cast<float>(sum / static_cast<double>(HW));
  }
}

// Backward threads: one element of dx per thread per grid-stride step.
__global__ void global_avg_pool_backward_kernel(int64_t planes, int64_t HW, const float* __restrict__ dy,
                                                float* __restrict__ dx) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < planes * HW; i += stride)
    dx[i] = dy[i / HW] / static_cast<float>(HW);
}

// ---- launchers
void max_pool2d_forward(Stream stream, const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  const int64_t OH = s.OH(), OW = s.OW(), n = s.N * s.C * OH * OW;
  D2L_LAUNCH_OVER(n, stream, max_pool2d_forward_kernel, s, OH, OW, x, y, argmax);
}

void max_pool2d_backward(Stream stream, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx) {
  const int64_t n = s.N * s.C * s.H * s.W;
  D2L_LAUNCH_OVER(n, stream, max_pool2d_backward_kernel, s, s.OH(), s.OW(), dy, argmax, dx);
}

void avg_pool2d_forward(Stream stream, const Pool2dShape& s, const float* x, float* y) {
  const int64_t OH = s.OH(), OW = s.OW(), n = s.N * s.C * OH * OW;
  D2L_LAUNCH_OVER(n, stream, avg_pool2d_forward_kernel, s, OH, OW, x, y);
}

void avg_pool2d_backward(Stream stream, const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t n = s.N * s.C * s.H * s.W;
  D2L_LAUNCH_OVER(n, stream, avg_pool2d_backward_kernel, s, s.OH(), s.OW(), dy, dx);
}

void global_avg_pool_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, float* y) {
  if (N * C <= 0) return;
  D2L_LAUNCH(global_avg_pool_forward_kernel, grid_for(N * C * 32), kThreads, 0, stream)(N * C, HW, x, y);
  D2L_CHECK_LAUNCH(global_avg_pool_forward_kernel);
}

void global_avg_pool_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* dy, float* dx) {
  if (N * C * HW <= 0) return;
  D2L_LAUNCH(global_avg_pool_backward_kernel, grid_for(N * C * HW), kThreads, 0, stream)(N * C, HW, dy, dx);
  D2L_CHECK_LAUNCH(global_avg_pool_backward_kernel);
}

}  // namespace D2L_CUDA_NS
