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

#include "kernels.hpp"

namespace d2l::kernels::cpu {

// ---- max pooling
void max_pool2d_forward(const Ctx& c, const Pool2dShape& s, const float* x, float* y, int32_t* argmax) {
  const int64_t OH = s.OH(), OW = s.OW();
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* xp = x + p * s.H * s.W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
          float best = 0.0f;
          int64_t best_i = -1;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + s.KH, s.H); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + s.KW, s.W); ++iw) {
              const float v = xp[ih * s.W + iw];
              // strictly greater: the first maximum wins ties; the first NaN wins over numbers
              if (best_i < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                best_i = ih * s.W + iw;
              }
            }
          const int64_t o = p * OH * OW + oh * OW + ow;
          y[o] = best;
          argmax[o] = static_cast<int32_t>(best_i);
        }
    }
  });
}

void max_pool2d_backward(const Ctx& c, const Pool2dShape& s, const float* dy, const int32_t* argmax,
                         float* dx) {
  const int64_t P = s.OH() * s.OW(), HW = s.H * s.W;
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      float* dxp = dx + p * HW;
      std::fill(dxp, dxp + HW, 0.0f);
      for (int64_t o = p * P; o < (p + 1) * P; ++o)
        if (argmax[o] >= 0) dxp[argmax[o]] += dy[o];
    }
  });
}

// ---- average pooling (padding counted: always divide by KH*KW)
void avg_pool2d_forward(const Ctx& c, const Pool2dShape& s, const float* x, float* y) {
  const int64_t OH = s.OH(), OW = s.OW();
  const float inv_area = 1.0f / static_cast<float>(s.KH * s.KW);
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* xp = x + p * s.H * s.W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
          float sum = 0.0f;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + s.KH, s.H); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + s.KW, s.W); ++iw)
              sum += xp[ih * s.W + iw];
          y[p * OH * OW + oh * OW + ow] = sum * inv_area;
        }
    }
  });
}

void avg_pool2d_backward(const Ctx& c, const Pool2dShape& s, const float* dy, float* dx) {
  const int64_t OH = s.OH(), OW = s.OW(), HW = s.H * s.W;
  const float inv_area = 1.0f / static_cast<float>(s.KH * s.KW);
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      float* dxp = dx + p * HW;
      std::fill(dxp, dxp + HW, 0.0f);
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
          const float g = dy[p * OH * OW + oh * OW + ow] * inv_area;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + s.KH, s.H); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + s.KW, s.W); ++iw)
              dxp[ih * s.W + iw] += g;
        }
    }
  });
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
