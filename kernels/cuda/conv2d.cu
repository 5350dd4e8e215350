// conv2d: the book's 2-D convolution (a cross-correlation, no bias) on the GPU, the CUDA twin of
// kernels/cpu/conv2d.cpp: the same family, the same names, the same vocabulary.
//   x (N, C, H, W), w (OC, C, KH, KW) -> y (N, OC, OH, OW)
//   y[n][oc][oh][ow] = sum over ci, kh, kw of x[n][ci][oh*stride_h - pad_h + kh][ow*stride_w - pad_w + kw]
//                                             * w[oc][ci][kh][kw]        (x is 0 in the padding)
//   OH = (H + 2*pad_h - KH) / stride_h + 1, OW likewise.
//
//   kernel1  direct   the loops of the definition, one thread per output value (y, dx or dw): the
//                     reference, read it first (conv2d_*_direct)
//   kernel2  im2col   im2col + the GEMM (+ col2im for backward_data), one image at a time (the CPU's
//                     kernel2 takes chunks of images): the textbook method (conv2d_*_im2col)
//   kernel3  winograd Winograd's minimal filtering F(4x4, 3x3) (winograd2: F(2x2, 3x3)) for 3x3
//                     stride-1 forward and backward_data: transformed filters and tiles, alpha^2 GEMMs,
//                     the output transform (conv2d_winograd.cu; other shapes run kernel2)
//   kernel5  implicit the whole batch as one GEMM per pass, im2col's index arithmetic done while loading
//                     shared-memory tiles: no col buffer, no loop over images (conv2d_implicit.cu)
// conv2d_forward, conv2d_backward_data and conv2d_backward_weight, at the end of the file, run the
// member the CPU's set_conv2d_kernel chose (automatic: winograd where it fits; bench/README.md has
// the measurements).
//
// kernel2: im2col unrolls one image into col (C*KH*KW, OH*OW): row (ci, kh, kw), column (oh, ow) holds
//   x[ci][oh*stride_h - pad_h + kh][ow*stride_w - pad_w + kw]   (0 where that falls in the padding),
// so that with K = C*KH*KW and P = OH*OW, per image n (GEMMs as set_conv2d_gemm chose):
//   forward          y_n (OC, P)  = w (OC, K) @ col_n (K, P)
//   backward_data    col (K, P)   = w^T @ dy_n,     then col2im adds col back into dx_n
//   backward_weight  dw (OC, K)   = sum over n of dy_n (OC, P) @ col_n^T   (accumulated in image order)
// A 1x1, stride-1, unpadded conv needs no unrolling: col_n is x_n itself, viewed as (C, H*W).
#include "kernels/cuda/d2l_cuda.cuh"
#include "kernels/cuda/kernels.hpp"
#include "kernels/cuda/common.cuh"

#include <algorithm>
#include <atomic>
#include <stdexcept>

namespace D2L_CUDA_NS {

// ======== kernel1: direct loops (the reference) ========

// Forward. Threads: one output element o = ((n * OC + oc) * OH + oh) * OW + ow per
// thread per grid-stride step; it reads its C*KH*KW window of x and the filter w[oc].
__global__ void conv2d_forward_direct_kernel(Conv2dShape s, int64_t OH, int64_t OW, const float* __restrict__ x,
                                             const float* __restrict__ w, float* __restrict__ y) {
  const int64_t total = s.N * s.OC * OH * OW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t o = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; o < total; o += stride) {
    const int64_t ow = o % OW, oh = o / OW % OH, oc = o / (OW * OH) % s.OC, n = o / (OW * OH * s.OC);
    float acc = 0.0f;
    for (int64_t ci = 0; ci < s.C; ++ci) {
      const float* xc = x + (n * s.C + ci) * s.H * s.W;
      const float* wc = w + (oc * s.C + ci) * s.KH * s.KW;
      for (int64_t kh = 0; kh < s.KH; ++kh) {
        const int64_t ih = oh * s.stride_h - s.pad_h + kh;
        if (ih < 0 || ih >= s.H) continue;  // padding row: contributes 0
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          const int64_t iw = ow * s.stride_w - s.pad_w + kw;
          if (iw >= 0 && iw < s.W) acc += xc[ih * s.W + iw] * wc[kh * s.KW + kw];
        }
      }
    }
    y[o] = acc;
  }
}

// Backward for x, gathered: dx[n][ci][ih][iw] = sum of dy[n][oc][oh][ow] * w[oc][ci][kh][kw] over the
// (oc, kh, kw) whose window put x[n][ci][ih][iw] into y[n][oc][oh][ow] (oh*stride_h - pad_h + kh == ih,
// likewise ow). Threads: one dx element per thread per grid-stride step; one writer each, no atomics.
__global__ void conv2d_backward_data_direct_kernel(Conv2dShape s, int64_t OH, int64_t OW, const float* __restrict__ dy,
                                                   const float* __restrict__ w, float* __restrict__ dx) {
  const int64_t total = s.N * s.C * s.H * s.W, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t iw = i % s.W, ih = i / s.W % s.H, ci = i / (s.W * s.H) % s.C, n = i / (s.W * s.H * s.C);
    float acc = 0.0f;
    for (int64_t oc = 0; oc < s.OC; ++oc)
      for (int64_t kh = 0; kh < s.KH; ++kh) {
        const int64_t th = ih + s.pad_h - kh;  // = oh * stride_h
        if (th < 0 || th % s.stride_h != 0 || th / s.stride_h >= OH) continue;
        for (int64_t kw = 0; kw < s.KW; ++kw) {
          const int64_t tw = iw + s.pad_w - kw;  // = ow * stride_w
          if (tw < 0 || tw % s.stride_w != 0 || tw / s.stride_w >= OW) continue;
          acc += dy[((n * s.OC + oc) * OH + th / s.stride_h) * OW + tw / s.stride_w] *
                 w[((oc * s.C + ci) * s.KH + kh) * s.KW + kw];
        }
      }
    dx[i] = acc;
  }
}

// Backward for w: dw[oc][ci][kh][kw] = sum over n, oh, ow of dy[n][oc][oh][ow] * (the x that w met
// there). Threads: one dw element per thread per grid-stride step, summing in a fixed order.
__global__ void conv2d_backward_weight_direct_kernel(Conv2dShape s, int64_t OH, int64_t OW, const float* __restrict__ x,
                                                     const float* __restrict__ dy, float* __restrict__ dw) {
  const int64_t total = s.OC * s.C * s.KH * s.KW, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t kw = i % s.KW, kh = i / s.KW % s.KH, ci = i / (s.KW * s.KH) % s.C, oc = i / (s.KW * s.KH * s.C);
    float acc = 0.0f;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t oh = 0; oh < OH; ++oh) {
        const int64_t ih = oh * s.stride_h - s.pad_h + kh;
        if (ih < 0 || ih >= s.H) continue;
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t iw = ow * s.stride_w - s.pad_w + kw;
          if (iw >= 0 && iw < s.W)
            acc += dy[((n * s.OC + oc) * OH + oh) * OW + ow] * x[((n * s.C + ci) * s.H + ih) * s.W + iw];
        }
      }
    dw[i] = acc;
  }
}

void conv2d_forward_direct(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  const int64_t OH = s.OH(), OW = s.OW(), n = s.N * s.OC * OH * OW;
  D2L_LAUNCH_OVER(n, stream, conv2d_forward_direct_kernel, s, OH, OW, x, w, y);
}

void conv2d_backward_data_direct(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t n = s.N * s.C * s.H * s.W;
  D2L_LAUNCH_OVER(n, stream, conv2d_backward_data_direct_kernel, s, s.OH(), s.OW(), dy, w, dx);
}

void conv2d_backward_weight_direct(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t n = s.OC * s.C * s.KH * s.KW;
  D2L_LAUNCH_OVER(n, stream, conv2d_backward_weight_direct_kernel, s, s.OH(), s.OW(), x, dy, dw);
}

// ======== kernel2: im2col + the GEMM (+ col2im), one image at a time ========

namespace {
int64_t col_rows(const Conv2dShape& s) { return s.C * s.KH * s.KW; }
int64_t col_cols(const Conv2dShape& s) { return s.OH() * s.OW(); }

// 1x1, stride 1, no padding: im2col would copy x_n unchanged.
bool is_pointwise(const Conv2dShape& s) {
  return s.KH == 1 && s.KW == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

std::atomic<GemmKernel> g_kernel{GemmKernel::tiled};
std::atomic<LibraryGemm> g_library{nullptr};

}  // namespace

// C = alpha op(A) @ op(B) + beta C with the GEMM set_conv2d_gemm chose (kernel3's GEMMs too).
void conv2d_gemm(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 const float* B, float beta, float* C) {
  if (LibraryGemm library = g_library.load(std::memory_order_relaxed))
    return library(stream, ta, tb, M, N, K, alpha, A, B, beta, C);
  gemm(stream, g_kernel.load(std::memory_order_relaxed), ta, tb, M, N, K, alpha, A, B, beta, C);
}

void set_conv2d_gemm(GemmKernel kernel, LibraryGemm library) {
  g_kernel = kernel;
  g_library = library;
}

static std::atomic<ScratchCounter> g_scratch_counter{nullptr};
void set_scratch_counter(ScratchCounter f) { g_scratch_counter = f; }
ScratchCounter scratch_counter() { return g_scratch_counter.load(std::memory_order_relaxed); }

// Threads: one col element per thread per grid-stride step: e = r * P + q, row r = (ci, kh, kw),
// column q = (oh, ow). Neighbouring threads write neighbouring col entries.
__global__ void im2col_kernel(Conv2dShape s, int64_t OH, int64_t OW, const float* __restrict__ x_img,
                              float* __restrict__ col) {
  const int64_t P = OH * OW, total = s.C * s.KH * s.KW * P, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; e < total; e += stride) {
    const int64_t q = e % P, r = e / P;
    const int64_t ow = q % OW, oh = q / OW;
    const int64_t kw = r % s.KW, kh = r / s.KW % s.KH, ci = r / (s.KW * s.KH);
    const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
    col[e] = (ih >= 0 && ih < s.H && iw >= 0 && iw < s.W) ? x_img[(ci * s.H + ih) * s.W + iw] : 0.0f;
  }
}

// The adjoint of im2col, adding into dx_img. Threads: one input pixel (ci, ih, iw) per thread per
// grid-stride step, gathering every col entry copied from it: for each (kh, kw), the output
// position with oh*stride_h - pad_h + kh == ih (if stride divides and it is inside), likewise ow.
// One writer per pixel: no atomics, and a fixed order of additions ((kh, kw) row-major).
__global__ void col2im_kernel(Conv2dShape s, int64_t OH, int64_t OW, const float* __restrict__ col,
                              float* __restrict__ dx_img) {
  const int64_t P = OH * OW, total = s.C * s.H * s.W, stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += stride) {
    const int64_t iw = i % s.W, ih = i / s.W % s.H, ci = i / (s.W * s.H);
    float g = 0.0f;
    for (int64_t kh = 0; kh < s.KH; ++kh) {
      const int64_t th = ih + s.pad_h - kh;  // = oh * stride_h
      if (th < 0 || th % s.stride_h != 0 || th / s.stride_h >= OH) continue;
      const int64_t oh = th / s.stride_h;
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const int64_t tw = iw + s.pad_w - kw;  // = ow * stride_w
        if (tw < 0 || tw % s.stride_w != 0 || tw / s.stride_w >= OW) continue;
        const int64_t ow = tw / s.stride_w;
        g += col[((ci * s.KH + kh) * s.KW + kw) * P + oh * OW + ow];
      }
    }
    dx_img[i] += g;
  }
}

// ---- launchers
void im2col(Stream stream, const Conv2dShape& s, const float* x_img, float* col) {
  const int64_t n = col_rows(s) * col_cols(s);
  D2L_LAUNCH_OVER(n, stream, im2col_kernel, s, s.OH(), s.OW(), x_img, col);
}

void col2im(Stream stream, const Conv2dShape& s, const float* col, float* dx_img) {
  const int64_t n = s.C * s.H * s.W;
  D2L_LAUNCH_OVER(n, stream, col2im_kernel, s, s.OH(), s.OW(), col, dx_img);
}

// The columns of image x_img: im2col into `col`, or, for a 1x1 stride-1 unpadded conv, the image
// itself (its columns are its pixels).
static const float* columns(Stream stream, const Conv2dShape& s, const float* x_img, float* col) {
  if (is_pointwise(s)) return x_img;
  im2col(stream, s, x_img, col);
  return col;
}

// ---- forward: y_n = w @ col_n
void conv2d_forward_im2col(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P;
  ScratchBuffer<float> col(stream, is_pointwise(s) ? 0 : K * P);
  for (int64_t n = 0; n < s.N; ++n) {
    const float* cn = columns(stream, s, x + n * x_img, col.data());
    conv2d_gemm(stream, false, false, s.OC, P, K, 1.0f, w, cn, 0.0f, y + n * y_img);
  }
}

// ---- backward_data: col = w^T @ dy_n, dx_n = col2im(col)
void conv2d_backward_data_im2col(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P;
  if (is_pointwise(s)) {  // col2im is the identity: write straight into dx_n
    for (int64_t n = 0; n < s.N; ++n)
      conv2d_gemm(stream, true, false, K, P, s.OC, 1.0f, w, dy + n * y_img, 0.0f, dx + n * x_img);
    return;
  }
  ScratchBuffer<float> col(stream, K * P);
  fill(stream, dx, s.N * x_img, 0.0f);  // col2im adds
  for (int64_t n = 0; n < s.N; ++n) {
    conv2d_gemm(stream, true, false, K, P, s.OC, 1.0f, w, dy + n * y_img, 0.0f, col.data());
    col2im(stream, s, col.data(), dx + n * x_img);
  }
}

// ---- backward_weight: dw = sum over n of dy_n @ col_n^T, accumulated image by image into dw
// (beta = 1 after the first image): one fixed order, so the same bits on every run.
void conv2d_backward_weight_im2col(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P;
  if (s.N == 0) return fill(stream, dw, s.OC * K, 0.0f);  // no images: the gradient is zero
  ScratchBuffer<float> col(stream, is_pointwise(s) ? 0 : K * P);
  for (int64_t n = 0; n < s.N; ++n) {
    const float* cn = columns(stream, s, x + n * x_img, col.data());
    conv2d_gemm(stream, false, true, s.OC, K, P, 1.0f, dy + n * y_img, cn, n == 0 ? 0.0f : 1.0f, dw);
  }
}

// ======== the choice: the CPU's, one table ========

// conv2d_forward, _backward_data and _backward_weight run the member that kernels::cpu::set_conv2d_kernel
// chose (kernels::cpu::conv2d_kernel(): one choice for every device), like the CPU's passes() table:
//   direct              kernel1's three passes
//   winograd            kernel3 F(4x4, 3x3) forward and backward_data, im2col's backward_weight
//   winograd2           kernel3 F(2x2, 3x3), likewise
//   implicit            kernel5's three passes
//   automatic           in TF32 (--precision tf32, or auto on a GPU of sm_80 or later): kernel5's three
//                       passes on tensor cores, as cuDNN's implicit-GEMM algorithms. In FP32: kernel3
//                       F(4x4, 3x3) forward and backward_data where it fits (its 36 GEMMs span the whole
//                       batch's tiles; im2col elsewhere), and kernel5's split-K backward_weight, which
//                       sums over the whole batch in one launch where im2col goes image by image
//                       (bench/README.md, "GPU GEMMs against cuBLAS"); under the emulation, where
//                       kernel5 is slow, im2col's backward_weight
//   anything else       kernel2 im2col (im2col itself; blocked, a CPU member, runs it here)
// kernel3's launchers run im2col themselves for the shapes they do not take (not 3x3 stride 1, or, for
// backward_data, padding above 2).
namespace {
using Pass = void (*)(Stream, const Conv2dShape&, const float*, const float*, float*);
struct Passes {
  Pass forward, backward_data, backward_weight;
};
Passes passes(::d2l::kernels::cpu::Conv2dKernel k) {
  using ::d2l::kernels::cpu::Conv2dKernel;
  switch (k) {
    case Conv2dKernel::direct:
      return {conv2d_forward_direct, conv2d_backward_data_direct, conv2d_backward_weight_direct};
    case Conv2dKernel::automatic:
      if (uses_tf32())
        return {conv2d_forward_implicit, conv2d_backward_data_implicit, conv2d_backward_weight_implicit};
#ifdef __CUDACC__
      return {conv2d_forward_winograd, conv2d_backward_data_winograd, conv2d_backward_weight_implicit};
#else
      // Under the emulation each of kernel5's emulated threads is a fiber switched at every barrier:
      // its split-K backward_weight costs seven times im2col's (chapter 1's quick epoch, 39 s against
      // 5.7 s), so the emulated GPU's FP32 choice keeps im2col there. kernel5 itself stays tested
      // (tests/test_conv2d.cpp, test_emu_ops_nn.cpp, --conv implicit).
      return {conv2d_forward_winograd, conv2d_backward_data_winograd, conv2d_backward_weight_im2col};
#endif
    case Conv2dKernel::winograd:
      return {conv2d_forward_winograd, conv2d_backward_data_winograd, conv2d_backward_weight_im2col};
    case Conv2dKernel::winograd2:
      return {conv2d_forward_winograd2, conv2d_backward_data_winograd2, conv2d_backward_weight_im2col};
    case Conv2dKernel::implicit:
      return {conv2d_forward_implicit, conv2d_backward_data_implicit, conv2d_backward_weight_implicit};
    default:
      return {conv2d_forward_im2col, conv2d_backward_data_im2col, conv2d_backward_weight_im2col};
  }
}
Passes chosen() { return passes(::d2l::kernels::cpu::conv2d_kernel()); }
}  // namespace

void conv2d_forward(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y) {
  chosen().forward(stream, s, x, w, y);
}
void conv2d_backward_data(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  chosen().backward_data(stream, s, dy, w, dx);
}
void conv2d_backward_weight(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  chosen().backward_weight(stream, s, x, dy, dw);
}

}  // namespace D2L_CUDA_NS
