// 2-D max and average pooling, and global average pooling.
//   x (N, C, H, W) -> y (N, C, OH, OW), OH = (H + 2*pad_h - KH) / stride_h + 1, OW likewise.
// Output (oh, ow) looks at the window of input rows oh*stride_h - pad_h + [0, KH) and columns
// ow*stride_w - pad_w + [0, KW); positions outside the image are padding.
//   max: y = the largest value in the window; padding never wins. argmax (N, C, OH, OW) int32 keeps
//        the winner's flat index h*W + w within its (n, c) plane (first one on ties; a NaN wins, so it
//        propagates). A window of padding only (impossible when pad <= kernel/2) gives y = 0, argmax -1.
//        backward: dx[argmax] += dy.
//   avg: y = (sum of the window's image values) / (KH*KW): padding counts as zeros.
//        backward: each image position of the window gets dy / (KH*KW).
//   global avg: x (N, C, HW) -> y (N, C) = mean over HW; backward dx = dy / HW.
// Every (n, c) plane is independent: all loops split over the N*C planes, so backward scatters
// without races. Backward overwrites dx.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>
#include <vector>

#include "activation_loops_once.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

// ---- max pooling: activation_loops.hpp's loops, shared with the 16-bit activations (activations16.cpp)
void max_pool2d_forward(const Ctx& c, const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  loops::max_pool_forward<AsF32>(c, s, x, y, argmax);
}

void max_pool2d_backward(const Ctx& c, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx) {
  loops::max_pool_backward<AsF32>(c, s, dy, argmax, dx);
}

// ---- average pooling (padding counted: always divide by KH*KW)
// One output at a time, its window summed in (kh, kw) order in a register. Two things make this fast:
// - the window loops are a template on the window size: for the usual 2x2 and 3x3 windows the size
//   is a compile-time constant and the compiler unrolls them (FKH = FKW = 0: any other window);
// - windows wholly inside the image (all but the border ones: all of them without padding) are
//   summed with no bounds checks; only the border ones clip their window to the image.
namespace {

// The window of output (oh, ow): top-left input corner (h0, w0), clipped to the image as
// rows [kh0, kh1) x columns [kw0, kw1) of the window.
struct Window {
  int64_t h0, w0, kh0, kh1, kw0, kw1;
  Window(const Pool2dShape& s, int64_t KH, int64_t KW, int64_t oh, int64_t ow)
      : h0(oh * s.stride_h - s.pad_h), w0(ow * s.stride_w - s.pad_w),
        kh0(std::max<int64_t>(0, -h0)), kh1(std::min(KH, s.H - h0)),
        kw0(std::max<int64_t>(0, -w0)), kw1(std::min(KW, s.W - w0)) {}
};

// The outputs ow whose whole window lies inside the image's columns: [begin, end).
std::pair<int64_t, int64_t> interior_columns(const Pool2dShape& s, int64_t KW) {
  const int64_t OW = s.OW();
  const int64_t begin = std::min(OW, (s.pad_w + s.stride_w - 1) / s.stride_w);  // w0 >= 0
  const int64_t end = s.W - KW + s.pad_w < 0 ? 0 : std::min(OW, (s.W - KW + s.pad_w) / s.stride_w + 1);  // w0 + KW <= W
  return {begin, std::max(begin, end)};
}

template <int FKH, int FKW>
void avg_forward_planes(const Pool2dShape& s, const float* x, float* y, int64_t begin, int64_t end) {
  const int64_t KH = FKH ? FKH : s.KH, KW = FKW ? FKW : s.KW, OH = s.OH(), OW = s.OW(), W = s.W;
  const float inv_area = 1.0f / static_cast<float>(KH * KW);
  const auto [inner_begin, inner_end] = interior_columns(s, KW);
  for (int64_t p = begin; p < end; ++p) {
    const float* xp = x + p * s.H * W;
    for (int64_t oh = 0; oh < OH; ++oh) {
      float* out = y + (p * OH + oh) * OW;
      const auto clipped = [&](int64_t ow) {  // a border window
        const Window w(s, KH, KW, oh, ow);
        float sum = 0.0f;
        for (int64_t kh = w.kh0; kh < w.kh1; ++kh)
          for (int64_t kw = w.kw0; kw < w.kw1; ++kw) sum += xp[(w.h0 + kh) * W + w.w0 + kw];
        out[ow] = sum * inv_area;
      };
      const int64_t h0 = oh * s.stride_h - s.pad_h;
      if (h0 < 0 || h0 + KH > s.H) {  // a row of border windows
        for (int64_t ow = 0; ow < OW; ++ow) clipped(ow);
        continue;
      }
      for (int64_t ow = 0; ow < inner_begin; ++ow) clipped(ow);
      for (int64_t ow = inner_begin; ow < inner_end; ++ow) {
        const float* window = xp + h0 * W + ow * s.stride_w - s.pad_w;  // window[kh * W + kw]
        float sum = 0.0f;
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) sum += window[kh * W + kw];
        out[ow] = sum * inv_area;
      }
      for (int64_t ow = inner_end; ow < OW; ++ow) clipped(ow);
    }
  }
}

// Each output's window gets dy / (KH*KW), windows visited in (oh, ow) order.
template <int FKH, int FKW>
void avg_backward_planes(const Pool2dShape& s, const float* dy, float* dx, int64_t begin, int64_t end) {
  const int64_t KH = FKH ? FKH : s.KH, KW = FKW ? FKW : s.KW, OH = s.OH(), OW = s.OW(), W = s.W;
  const float inv_area = 1.0f / static_cast<float>(KH * KW);
  const auto [inner_begin, inner_end] = interior_columns(s, KW);
  for (int64_t p = begin; p < end; ++p) {
    float* dxp = dx + p * s.H * W;
    std::fill(dxp, dxp + s.H * W, 0.0f);
    for (int64_t oh = 0; oh < OH; ++oh) {
      const float* g = dy + (p * OH + oh) * OW;
      const auto clipped = [&](int64_t ow) {
        const Window w(s, KH, KW, oh, ow);
        const float share = g[ow] * inv_area;
        for (int64_t kh = w.kh0; kh < w.kh1; ++kh)
          for (int64_t kw = w.kw0; kw < w.kw1; ++kw) dxp[(w.h0 + kh) * W + w.w0 + kw] += share;
      };
      const int64_t h0 = oh * s.stride_h - s.pad_h;
      if (h0 < 0 || h0 + KH > s.H) {
        for (int64_t ow = 0; ow < OW; ++ow) clipped(ow);
        continue;
      }
      for (int64_t ow = 0; ow < inner_begin; ++ow) clipped(ow);
      for (int64_t ow = inner_begin; ow < inner_end; ++ow) {
        float* window = dxp + h0 * W + ow * s.stride_w - s.pad_w;
        const float share = g[ow] * inv_area;
        for (int64_t kh = 0; kh < KH; ++kh)
          for (int64_t kw = 0; kw < KW; ++kw) window[kh * W + kw] += share;
      }
      for (int64_t ow = inner_end; ow < OW; ++ow) clipped(ow);
    }
  }
}

using PlanesFn = void (*)(const Pool2dShape&, const float*, float*, int64_t, int64_t);
}  // namespace

void avg_pool2d_forward(const Ctx& c, const Pool2dShape& s, const float* x, float* y) {
  PlanesFn planes = avg_forward_planes<0, 0>;
  if (s.KH == 2 && s.KW == 2) planes = avg_forward_planes<2, 2>;
  if (s.KH == 3 && s.KW == 3) planes = avg_forward_planes<3, 3>;
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) { planes(s, x, y, begin, end); });
}

void avg_pool2d_backward(const Ctx& c, const Pool2dShape& s, const float* dy, float* dx) {
  PlanesFn planes = avg_backward_planes<0, 0>;
  if (s.KH == 2 && s.KW == 2) planes = avg_backward_planes<2, 2>;
  if (s.KH == 3 && s.KW == 3) planes = avg_backward_planes<3, 3>;
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) { planes(s, dy, dx, begin, end); });
}

// ---- global average pooling: x (N, C, HW) -> y (N, C)
void global_avg_pool_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, float* y) {
  c.parallel_for(N * C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      double sum = 0.0;
      for (int64_t i = 0; i < HW; ++i) sum += x[p * HW + i];
      y[p] = static_cast<float>(sum / static_cast<double>(HW));
    }
  });
}

void global_avg_pool_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* dy, float* dx) {
  c.parallel_for(N * C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float g = dy[p] / static_cast<float>(HW);
      std::fill(dx + p * HW, dx + (p + 1) * HW, g);
    }
  });
}

}  // namespace d2l::kernels::cpu
