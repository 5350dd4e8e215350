// 2-D convolution (the book's cross-correlation, no bias) by im2col + GEMM.
//   x (N, C, H, W), w (OC, C, KH, KW) -> y (N, OC, OH, OW)
//   OH = (H + 2*pad_h - KH) / stride_h + 1, OW likewise.
// im2col unrolls one image into col (C*KH*KW, OH*OW): row (ci, kh, kw), column (oh, ow) holds
//   x[ci][oh*stride_h - pad_h + kh][ow*stride_w - pad_w + kw]   (0 where that falls in the padding),
// so that with K = C*KH*KW and P = OH*OW, per image n:
//   forward          y_n (OC, P)  = w (OC, K) @ col_n (K, P)
//   backward_data    col (K, P)   = w^T @ dy_n,     then col2im adds col back into dx_n
//   backward_weight  dw (OC, K)   = sum over n of dy_n (OC, P) @ col_n^T
// A 1x1, stride-1, unpadded conv needs no unrolling: col_n is x_n itself, viewed as (C, H*W).
//
// Threads: with at least as many images as threads, each thread takes whole images (its own col
// buffer, a serial gemm); with fewer images, images run one at a time and gemm splits its rows over
// the device's threads.
#include <algorithm>
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

int64_t col_rows(const Conv2dShape& s) { return s.C * s.KH * s.KW; }
int64_t col_cols(const Conv2dShape& s) { return s.OH() * s.OW(); }

// 1x1, stride 1, no padding: im2col would copy x_n unchanged.
bool is_pointwise(const Conv2dShape& s) {
  return s.KH == 1 && s.KW == 1 && s.stride_h == 1 && s.stride_w == 1 && s.pad_h == 0 && s.pad_w == 0;
}

// Whole images per thread when there are enough of them, else let gemm use the threads.
bool split_over_images(const Ctx& c, int64_t N) { return c.threads > 1 && N >= c.threads; }

}  // namespace

void im2col(const Conv2dShape& s, const float* x_img, float* col) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t ci = 0; ci < s.C; ++ci) {
    const float* xc = x_img + ci * s.H * s.W;
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        float* row = col + ((ci * s.KH + kh) * s.KW + kw) * OH * OW;
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t ih = oh * s.stride_h - s.pad_h + kh;
          float* out = row + oh * OW;
          if (ih < 0 || ih >= s.H) {  // the whole output row reads padding
            std::fill(out, out + OW, 0.0f);
            continue;
          }
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t iw = ow * s.stride_w - s.pad_w + kw;
            out[ow] = (iw >= 0 && iw < s.W) ? xc[ih * s.W + iw] : 0.0f;
          }
        }
      }
  }
}

// The adjoint of im2col: every col entry is added to the input pixel it was copied from
// (padding entries are dropped). dx_img must be zeroed by the caller.
void col2im(const Conv2dShape& s, const float* col, float* dx_img) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t ci = 0; ci < s.C; ++ci) {
    float* dxc = dx_img + ci * s.H * s.W;
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const float* row = col + ((ci * s.KH + kh) * s.KW + kw) * OH * OW;
        for (int64_t oh = 0; oh < OH; ++oh) {
          const int64_t ih = oh * s.stride_h - s.pad_h + kh;
          if (ih < 0 || ih >= s.H) continue;
          const float* in = row + oh * OW;
          for (int64_t ow = 0; ow < OW; ++ow) {
            const int64_t iw = ow * s.stride_w - s.pad_w + kw;
            if (iw >= 0 && iw < s.W) dxc[ih * s.W + iw] += in[ow];
          }
        }
      }
  }
}

// ---- forward: y_n = w @ col_n
void conv2d_forward(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P;
  // Images [begin, end) with one col buffer; gemm runs on `gc` (serial or the device's threads).
  auto images = [&](const Ctx& gc, int64_t begin, int64_t end) {
    std::vector<float> col(is_pointwise(s) ? 0 : K * P);
    for (int64_t n = begin; n < end; ++n) {
      const float* cn = x + n * x_img;
      if (!is_pointwise(s)) {
        im2col(s, x + n * x_img, col.data());
        cn = col.data();
      }
      gemm(gc, false, false, s.OC, P, K, 1.0f, w, cn, 0.0f, y + n * y_img);
    }
  };
  if (split_over_images(c, s.N))
    c.parallel_for(s.N, [&](int64_t b, int64_t e) { images(serial_ctx(), b, e); });
  else
    images(c, 0, s.N);
}

// ---- backward_data: col = w^T @ dy_n, dx_n = col2im(col)
void conv2d_backward_data(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P;
  auto images = [&](const Ctx& gc, int64_t begin, int64_t end) {
    std::vector<float> col(is_pointwise(s) ? 0 : K * P);
    for (int64_t n = begin; n < end; ++n) {
      float* dxn = dx + n * x_img;
      if (is_pointwise(s)) {  // col2im is the identity: write straight into dx_n
        gemm(gc, true, false, K, P, s.OC, 1.0f, w, dy + n * y_img, 0.0f, dxn);
        continue;
      }
      gemm(gc, true, false, K, P, s.OC, 1.0f, w, dy + n * y_img, 0.0f, col.data());
      std::fill(dxn, dxn + x_img, 0.0f);
      col2im(s, col.data(), dxn);
    }
  };
  if (split_over_images(c, s.N))
    c.parallel_for(s.N, [&](int64_t b, int64_t e) { images(serial_ctx(), b, e); });
  else
    images(c, 0, s.N);
}

// ---- backward_weight: dw = sum over n of dy_n @ col_n^T
// The images are cut into G groups fixed by the shape alone (never by the thread count). Each
// group sums its images, in order, into its own partial dw (group 0 into dw itself); the partials
// are then added in group order. So dw does not depend on the number of threads (as long as a
// gemm row does not depend on how gemm splits its rows).
void conv2d_backward_weight(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t K = col_rows(s), P = col_cols(s);
  const int64_t x_img = s.C * s.H * s.W, y_img = s.OC * P, wsize = s.OC * K;
  constexpr int64_t kMaxGroups = 64, kPartialBudget = int64_t{1} << 22;  // floats (16 MiB) for partials
  const int64_t G =
      std::max<int64_t>(1, std::min({s.N, kMaxGroups, kPartialBudget / std::max<int64_t>(wsize, 1)}));
  std::vector<float> partial((G - 1) * wsize);

  // Groups [gbegin, gend) with one col buffer; gemm runs on `gc`.
  auto groups = [&](const Ctx& gc, int64_t gbegin, int64_t gend) {
    std::vector<float> col(is_pointwise(s) ? 0 : K * P);
    for (int64_t g = gbegin; g < gend; ++g) {
      float* out = g == 0 ? dw : partial.data() + (g - 1) * wsize;
      const int64_t first = s.N * g / G, last = s.N * (g + 1) / G;
      for (int64_t n = first; n < last; ++n) {
        const float* cn = x + n * x_img;
        if (!is_pointwise(s)) {
          im2col(s, x + n * x_img, col.data());
          cn = col.data();
        }
        gemm(gc, false, true, s.OC, K, P, 1.0f, dy + n * y_img, cn, n == first ? 0.0f : 1.0f, out);
      }
    }
  };
  if (G >= c.threads)
    c.parallel_for(G, [&](int64_t b, int64_t e) { groups(serial_ctx(), b, e); });
  else
    groups(c, 0, G);

  if (s.N == 0) std::fill(dw, dw + wsize, 0.0f);  // no images: the gradient is zero
  if (G == 1) return;
  c.parallel_for(wsize, [&](int64_t b, int64_t e) {
    for (int64_t g = 1; g < G; ++g) {
      const float* p = partial.data() + (g - 1) * wsize;
      for (int64_t i = b; i < e; ++i) dw[i] += p[i];
    }
  });
}

}  // namespace d2l::kernels::cpu
