// conv2d: the book's 2-D convolution (a cross-correlation, no bias) on the CPU, as a family of kernels.
//   x (N, C, H, W), w (OC, C, KH, KW) -> y (N, OC, OH, OW)
//   y[n][oc][oh][ow] = sum over ci, kh, kw of x[n][ci][oh*stride_h - pad_h + kh][ow*stride_w - pad_w + kw]
//                                             * w[oc][ci][kh][kw]        (x is 0 in the padding)
//   OH = (H + 2*pad_h - KH) / stride_h + 1, OW likewise.
//
//   kernel1  direct   the loops of the definition, forward and both backward passes: the reference,
//                     read it first (conv2d_*_direct)
//   kernel2  im2col   im2col + the GEMM (+ col2im for backward_data) over chunks of images: the
//                     textbook method (conv2d_*_im2col)
//   kernel3  winograd Winograd's minimal filtering F(4x4, 3x3) (winograd2: F(2x2, 3x3)) for 3x3
//                     stride-1 forward and backward_data: alpha^2 GEMMs on transformed tiles, 4x
//                     (2.25x) fewer flops (conv2d_winograd.cpp; other shapes run kernel2)
//   kernel4  blocked  direct loops on a filter blocked by output channels, vectorised over them (16
//                     or 8 floats, the CPU's widest), no im2col buffer (conv2d_blocked.cpp;
//                     backward_data for stride 1, other strides run kernel2's; backward_weight)
//   automatic         a member per shape (conv2d_auto_kernel, below): the default
// conv2d_forward, conv2d_backward_data and conv2d_backward_weight, at the end of the file, run the
// member set_conv2d_kernel chose: the one place the choice is made. tests/test_conv2d.cpp checks
// every member against kernel1 and against a double-precision reference. kernels/cuda/conv2d.cu has
// kernel1 and kernel2 with the same names and vocabulary on the GPU.
#include <algorithm>
#include <atomic>
#include <bit>
#include <type_traits>
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

// ======== kernel1: direct loops (the reference) ========

// Forward: each output is the sum of its window's products. Threads take whole (n, oc) planes.
void conv2d_forward_direct(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  const int64_t OH = s.OH(), OW = s.OW();
  c.parallel_for(s.N * s.OC, [&](int64_t begin, int64_t end) {
    for (int64_t plane = begin; plane < end; ++plane) {
      const int64_t n = plane / s.OC, oc = plane % s.OC;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          float acc = 0.0f;
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;  // padding: adds 0
                acc += x[((n * s.C + ci) * s.H + ih) * s.W + iw] * w[((oc * s.C + ci) * s.KH + kh) * s.KW + kw];
              }
          y[((n * s.OC + oc) * OH + oh) * OW + ow] = acc;
        }
    }
  });
}

// Backward for x: every product x * w that went into y[n][oc][oh][ow] sends dy * w back to that
// x (the same loops, the product's other factor). Threads take whole images (dx_n is theirs alone).
void conv2d_backward_data_direct(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  const int64_t OH = s.OH(), OW = s.OW();
  c.parallel_for(s.N, [&](int64_t begin, int64_t end) {
    for (int64_t n = begin; n < end; ++n) {
      std::fill(dx + n * s.C * s.H * s.W, dx + (n + 1) * s.C * s.H * s.W, 0.0f);
      for (int64_t oc = 0; oc < s.OC; ++oc)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            const float g = dy[((n * s.OC + oc) * OH + oh) * OW + ow];
            for (int64_t ci = 0; ci < s.C; ++ci)
              for (int64_t kh = 0; kh < s.KH; ++kh)
                for (int64_t kw = 0; kw < s.KW; ++kw) {
                  const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
                  if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                  dx[((n * s.C + ci) * s.H + ih) * s.W + iw] += g * w[((oc * s.C + ci) * s.KH + kh) * s.KW + kw];
                }
          }
    }
  });
}

// Backward for w: dw[oc][ci][kh][kw] = sum over n, oh, ow of dy[n][oc][oh][ow] * (the x that w met
// there). Threads take whole filters oc; each sums in the same order whatever the thread count.
void conv2d_backward_weight_direct(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  const int64_t OH = s.OH(), OW = s.OW();
  c.parallel_for(s.OC, [&](int64_t begin, int64_t end) {
    for (int64_t oc = begin; oc < end; ++oc)
      for (int64_t ci = 0; ci < s.C; ++ci)
        for (int64_t kh = 0; kh < s.KH; ++kh)
          for (int64_t kw = 0; kw < s.KW; ++kw) {
            float acc = 0.0f;
            for (int64_t n = 0; n < s.N; ++n)
              for (int64_t oh = 0; oh < OH; ++oh)
                for (int64_t ow = 0; ow < OW; ++ow) {
                  const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
                  if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                  acc += dy[((n * s.OC + oc) * OH + oh) * OW + ow] * x[((n * s.C + ci) * s.H + ih) * s.W + iw];
                }
            dw[((oc * s.C + ci) * s.KH + kh) * s.KW + kw] = acc;
          }
  });
}

// ======== kernel2: im2col + the GEMM (+ col2im), over chunks of images ========
//
// im2col unrolls one image into col (K, P), K = C*KH*KW, P = OH*OW: row (ci, kh, kw), column (oh, ow)
// holds x[ci][oh*stride_h - pad_h + kh][ow*stride_w - pad_w + kw]   (0 where that falls in the padding).
// Then, per image n: y_n (OC, P) = w (OC, K) @ col_n; col = w^T @ dy_n and col2im adds col back into
// dx_n; dw (OC, K) = sum over n of dy_n @ col_n^T.
//
// A chunk of B images is unrolled side by side into ONE col (K, B*P) (image b owns the columns
// b*P .. b*P + P-1), so that one GEMM covers the whole chunk:
//   forward          yc (OC, B*P) = w (OC, K) @ col (K, B*P),  then yc is copied out to each y_n (OC, P)
//   backward_data    col (K, B*P) = w^T @ dyc (OC, B*P),       then col2im adds col into each dx_n
//   backward_weight  dw (OC, K)  += dyc (OC, B*P) @ col^T
// where dyc is the chunk's dy_n (OC, P) side by side. Why chunks: a GEMM per image can be narrow
// (LeNet's conv2: (50, 500) @ (500, 81)) and OpenBLAS pays its call, packing and edge costs once per
// image; 7 such images make one GEMM with 567 columns. Images with enough columns of their own
// (LeNet's conv1: P = 676) stay one per chunk: then gemm reads and writes x_n's col, y_n and dy_n
// in place, with no copying to or from the chunk layout, and its output stays in cache.
//
// Chunk sizes depend on the shape only: B = enough images for kMinCols columns, but no more than
// fit in kColFloats of col, and no more than N / kMinChunks (so that the threads can share chunks).
// Threads: each thread takes whole chunks, im2cols them into its own col (a per-thread buffer kept
// from call to call: no allocation per minibatch) and calls a serial gemm. With fewer chunks than
// threads (a batch of one image) the chunks run one after another and gemm splits its rows over the
// threads instead. Since the chunks never depend on the thread count, neither do the results
// (except for gemm's row split in that few-chunks case).

namespace {

constexpr int64_t kMinCols = 512;                 // GEMMs 256..1024 wide ran alike here; 81 is ~15% slower
constexpr int64_t kColFloats = int64_t{1} << 19;  // 2 MiB of col per chunk: about one core's L2 cache
constexpr int64_t kMinChunks = 8;                 // but at least 8 chunks, to keep 2..8 threads busy
constexpr int64_t kMaxGroups = 16;                // backward_weight: partial sums of dw, at most
constexpr int64_t kPartialFloats = int64_t{1} << 23;  // ... and at most 32 MiB of them

int64_t col_rows(const Conv2dShape& s) { return s.C * s.KH * s.KW; }
int64_t col_cols(const Conv2dShape& s) { return s.OH() * s.OW(); }

// y[0, n) = x[0, n) and y[0, n) += x[0, n) for the short rows of im2col (LeNet's conv2: 9 floats), four
// floats at a time: GCC vectorizes at -O2 only loops whose trip count it knows, hence the fixed-length
// inner loops (all loads before the stores). copy_row ends with the last four floats, overlapping the
// block before them, instead of a one-at-a-time tail. always_inline: a call per 9 floats costs more
// than the copy.
[[gnu::always_inline]] inline void copy4(const float* x, float* y) {
  float v[4];
  for (int j = 0; j < 4; ++j) v[j] = x[j];
  for (int j = 0; j < 4; ++j) y[j] = v[j];
}
[[gnu::always_inline]] inline void copy_row(const float* x, float* y, int64_t n) {
  if (n < 4) {
    for (int64_t i = 0; i < n; ++i) y[i] = x[i];
    return;
  }
  for (int64_t i = 0; i + 4 < n; i += 4) copy4(x + i, y + i);
  copy4(x + n - 4, y + n - 4);
}
inline void copy_row(const uint16_t* x, uint16_t* y, int64_t n) { std::copy(x, x + n, y); }  // 16-bit im2col
[[gnu::always_inline]] inline void add_row(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    float v[4];
    for (int j = 0; j < 4; ++j) v[j] = y[i + j] + x[i + j];
    for (int j = 0; j < 4; ++j) y[i + j] = v[j];
  }
  for (; i < n; ++i) y[i] += x[i];
}

// Outputs [begin, end) along one axis.
struct Span {
  int64_t begin, end;
};

// Where each window offset reads the image rather than the padding, worked out once per call:
// rows[kh] = the output rows oh whose input row oh*stride_h - pad_h + kh lies inside [0, H),
// cols[kw] = the output columns ow whose input column ow*stride_w - pad_w + kw lies inside [0, W).
struct Geometry {
  Conv2dShape s;
  int64_t OH, OW;
  std::vector<Span> rows, cols;

  explicit Geometry(const Conv2dShape& shape) : s(shape), OH(shape.OH()), OW(shape.OW()) {
    for (int64_t kh = 0; kh < s.KH; ++kh) rows.push_back(inside(kh - s.pad_h, s.stride_h, s.H, OH));
    for (int64_t kw = 0; kw < s.KW; ++kw) cols.push_back(inside(kw - s.pad_w, s.stride_w, s.W, OW));
  }
  // The outputs o in [0, n) whose input o*stride + offset lies inside [0, size).
  static Span inside(int64_t offset, int64_t stride, int64_t size, int64_t n) {
    const int64_t begin = std::min(n, offset >= 0 ? 0 : (-offset + stride - 1) / stride);
    const int64_t end = offset > size - 1 ? 0 : (size - 1 - offset) / stride + 1;
    return {begin, std::clamp(end, begin, n)};
  }
};

// im2col of B consecutive images of x into col (K, B*P): row (ci, kh, kw) holds image 0's P columns,
// then image 1's, ... (so each row is written front to back). Output rows outside g.rows[kh] and
// output columns outside g.cols[kw] read padding (zeros); the rest is copied from x_b[ci], one run
// of output columns per output row. Rows with no padding at either end (all of them in LeNet) take
// the short loop: one copy per output row, pointers stepped rather than recomputed.
template <class T>  // float, or 16-bit values (bfloat16 or float16 bits: the copy is the same)
void im2col(const Geometry& g, const T* x, int64_t B, T* col) {
  const Conv2dShape& s = g.s;
  const int64_t P = g.OH * g.OW, OW = g.OW, x_img = s.C * s.H * s.W;
  for (int64_t ci = 0; ci < s.C; ++ci)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const Span rows = g.rows[kh], cols = g.cols[kw];
        const int64_t n = cols.end - cols.begin;  // output columns that read the image
        const bool whole_rows = s.stride_w == 1 && n == OW;
        // x_b[ci][ih][iw] for the first output row and column that read the image
        const int64_t ih = rows.begin * s.stride_h - s.pad_h + kh, iw = cols.begin * s.stride_w - s.pad_w + kw;
        for (int64_t b = 0; b < B; ++b) {
          T* row = col + ((ci * s.KH + kh) * s.KW + kw) * B * P + b * P;
          const T* in = x + b * x_img + (ci * s.H + ih) * s.W + iw;
          T* out = row + rows.begin * OW;
          std::fill(row, out, T{});  // output rows reading the padding above the image
          for (int64_t oh = rows.begin; oh < rows.end; ++oh, in += s.stride_h * s.W, out += OW) {
            if (whole_rows) {
              copy_row(in, out, OW);
              continue;
            }
            std::fill(out, out + cols.begin, T{});
            if (s.stride_w == 1)
              copy_row(in, out + cols.begin, n);
            else
              for (int64_t j = 0; j < n; ++j) out[cols.begin + j] = in[j * s.stride_w];
            std::fill(out + cols.begin + n, out + OW, T{});
          }
          std::fill(out, row + P, T{});  // ... and below it
        }
      }
}

// col2im, the adjoint of im2col: every col entry is added to the input pixel it was copied from
// (padding entries are dropped). Same loops as im2col, with `+=` into dx_b for `=` out of x_b.
void col2im(const Geometry& g, const float* col, int64_t B, float* dx) {
  const Conv2dShape& s = g.s;
  const int64_t P = g.OH * g.OW, OW = g.OW, x_img = s.C * s.H * s.W;
  for (int64_t ci = 0; ci < s.C; ++ci)
    for (int64_t kh = 0; kh < s.KH; ++kh)
      for (int64_t kw = 0; kw < s.KW; ++kw) {
        const Span rows = g.rows[kh], cols = g.cols[kw];
        const int64_t n = cols.end - cols.begin;
        const int64_t ih = rows.begin * s.stride_h - s.pad_h + kh, iw = cols.begin * s.stride_w - s.pad_w + kw;
        for (int64_t b = 0; b < B; ++b) {
          const float* from = col + ((ci * s.KH + kh) * s.KW + kw) * B * P + b * P + rows.begin * OW + cols.begin;
          float* out = dx + b * x_img + (ci * s.H + ih) * s.W + iw;
          for (int64_t oh = rows.begin; oh < rows.end; ++oh, from += OW, out += s.stride_h * s.W) {
            if (s.stride_w == 1)
              add_row(from, out, n);
            else
              for (int64_t j = 0; j < n; ++j) out[j * s.stride_w] += from[j];
          }
        }
      }
}

// Images (B, rows, P) <-> the chunk layout (rows, B*P) the GEMMs use (image b in columns b*P...).
template <class T>
void to_chunk(const T* images, int64_t B, int64_t rows, int64_t P, T* chunk) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r) copy_row(images + (b * rows + r) * P, chunk + r * B * P + b * P, P);
}
void from_chunk(const float* chunk, int64_t B, int64_t rows, int64_t P, float* images) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r) copy_row(chunk + r * B * P + b * P, images + (b * rows + r) * P, P);
}
// The same into 16-bit images (V = As16<F>): each float32 sum rounded once, to nearest even.
template <class V>
void from_chunk(const float* chunk, int64_t B, int64_t rows, int64_t P, uint16_t* images) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t r = 0; r < rows; ++r) {
      const float* in = chunk + r * B * P + b * P;
      uint16_t* out = images + (b * rows + r) * P;
      for (int64_t j = 0; j < P; ++j) out[j] = V::put(in[j]);
    }
}
template <class V>
void narrow_all(const float* x, int64_t n, uint16_t* y) {
  for (int64_t i = 0; i < n; ++i) y[i] = V::put(x[i]);
}

// The GEMM of the operands' type, C float32: gemm, or gemm16 on bfloat16 or float16 bits (`f`).
void gemm_of(const Ctx& c, Float16, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
             const float* B, float beta, float* C) {
  gemm(c, ta, tb, M, N, K, alpha, A, B, beta, C);
}
void gemm_of(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
             const uint16_t* B, float beta, float* C) {
  gemm16(c, f, ta, tb, M, N, K, alpha, A, B, beta, C);
}

// How the N images are cut into chunks: chunk i holds images [first(i), first(i + 1)), about B each.
struct Chunks {
  int64_t N, count;
  int64_t first(int64_t i) const { return N * i / count; }
};
Chunks chunks(const Conv2dShape& s) {
  const int64_t P = col_cols(s), per_image = col_rows(s) * P;
  const int64_t wide = (kMinCols + P - 1) / P;                // images for kMinCols columns
  const int64_t fits = kColFloats / per_image;                // images whose col fits kColFloats
  const int64_t share = (s.N + kMinChunks - 1) / kMinChunks;  // images per chunk for kMinChunks chunks
  const int64_t B = std::max<int64_t>(1, std::min({wide, fits, share}));
  return {s.N, (s.N + B - 1) / B};
}

// Calls item(gc, i) for i in [0, count): whole items per thread, each with a serial gemm (gc); or,
// with fewer items than threads, one after another with gemm using all the threads.
template <class Item>
void for_each_item(const Ctx& c, int64_t count, const Item& item) {
  if (count >= c.threads)
    c.parallel_for(count, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) item(serial_ctx(), i);
    });
  else
    for (int64_t i = 0; i < count; ++i) item(c, i);
}

}  // namespace

void im2col(const Conv2dShape& s, const float* x_img, float* col) { im2col(Geometry(s), x_img, 1, col); }

void col2im(const Conv2dShape& s, const float* col, float* dx_img) { col2im(Geometry(s), col, 1, dx_img); }

// ---- forward: yc = w @ col, per chunk
// V: y's element type (float16.hpp). AsF32: y float32 (one image a chunk: gemm writes y_n itself);
// As16<F>: y in 16 bits, the chunk's float32 sums rounded once as they are copied out, so no float32
// y is ever whole.
template <class V, class T>
static void forward_im2col(const Ctx& c, Float16 f, const Conv2dShape& s, const T* x, const T* w, typename V::T* y) {
  constexpr bool direct = std::is_same_v<V, AsF32>;
  const int64_t K = col_rows(s), P = col_cols(s), x_img = s.C * s.H * s.W, y_img = s.OC * P;
  const Chunks ch = chunks(s);
  const Geometry g(s);
  for_each_item(c, ch.count, [&](const Ctx& gc, int64_t i) {
    const int64_t n0 = ch.first(i), B = ch.first(i + 1) - n0;
    Scratch<T> col_buf(c.workspace, K * B * P);
    Scratch<float> chunk_buf(c.workspace, direct && B == 1 ? 0 : s.OC * B * P);
    T* col = col_buf.data();
    im2col(g, x + n0 * x_img, B, col);
    float* yc = chunk_buf.data();
    if constexpr (direct)
      if (B == 1) yc = y + n0 * y_img;  // one image: y_n (OC, P) is the chunk layout already
    gemm_of(gc, f, false, false, s.OC, B * P, K, 1.0f, w, col, 0.0f, yc);
    if constexpr (direct) {
      if (B > 1) from_chunk(yc, B, s.OC, P, y + n0 * y_img);
    } else {
      from_chunk<V>(yc, B, s.OC, P, y + n0 * y_img);
    }
  });
}
void conv2d_forward_im2col(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  forward_im2col<AsF32>(c, Float16::bf16, s, x, w, y);  // (f: unused for float32)
}
void conv2d16_forward(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* x, const uint16_t* w, uint16_t* y) {
  if (f == Float16::bf16)
    forward_im2col<As16<Float16::bf16>>(c, f, s, x, w, y);
  else
    forward_im2col<As16<Float16::f16>>(c, f, s, x, w, y);
}

// ---- backward_data: col = w^T @ dyc, then col2im into each dx_n, per chunk
// V as forward's: with As16<F> col2im adds into the chunk's float32 dx, rounded once into dx's 16 bits.
template <class V, class T>
static void backward_data_im2col(const Ctx& c, Float16 f, const Conv2dShape& s, const T* dy, const T* w,
                                 typename V::T* dx) {
  constexpr bool direct = std::is_same_v<V, AsF32>;
  const int64_t K = col_rows(s), P = col_cols(s), x_img = s.C * s.H * s.W, y_img = s.OC * P;
  const Chunks ch = chunks(s);
  const Geometry g(s);
  for_each_item(c, ch.count, [&](const Ctx& gc, int64_t i) {
    const int64_t n0 = ch.first(i), B = ch.first(i + 1) - n0;
    const T* dyc = dy + n0 * y_img;
    Scratch<T> chunk_buf(c.workspace, B > 1 ? s.OC * B * P : 0);
    Scratch<float> col_buf(c.workspace, K * B * P), dx_buf(c.workspace, direct ? 0 : B * x_img);
    if (B > 1) {
      to_chunk(dyc, B, s.OC, P, chunk_buf.data());
      dyc = chunk_buf.data();
    }
    float* col = col_buf.data();
    gemm_of(gc, f, true, false, K, B * P, s.OC, 1.0f, w, dyc, 0.0f, col);
    float* dxc = dx_buf.data();
    if constexpr (direct) dxc = dx + n0 * x_img;
    std::fill(dxc, dxc + B * x_img, 0.0f);
    col2im(g, col, B, dxc);
    if constexpr (!direct) narrow_all<V>(dxc, B * x_img, dx + n0 * x_img);
  });
}
void conv2d_backward_data_im2col(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  backward_data_im2col<AsF32>(c, Float16::bf16, s, dy, w, dx);
}
void conv2d16_backward_data(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* dy, const uint16_t* w,
                            uint16_t* dx) {
  if (f == Float16::bf16)
    backward_data_im2col<As16<Float16::bf16>>(c, f, s, dy, w, dx);
  else
    backward_data_im2col<As16<Float16::f16>>(c, f, s, dy, w, dx);
}

// ---- backward_weight: dw = sum over chunks of dyc @ col^T
// The chunks are cut into G groups fixed by the shape alone (never by the thread count). Each group
// sums its chunks, in order, into its own partial dw (group 0 into dw itself); the partials are then
// added in group order. So dw does not depend on the number of threads. G is a power of two, so
// 2, 4, 8 ... threads get equal numbers of groups.
template <class T>
static void backward_weight_im2col(const Ctx& c, Float16 f, const Conv2dShape& s, const T* x, const T* dy, float* dw) {
  const int64_t K = col_rows(s), P = col_cols(s), x_img = s.C * s.H * s.W, y_img = s.OC * P;
  const int64_t wsize = s.OC * K;
  const Chunks ch = chunks(s);
  const Geometry g(s);
  if (ch.count == 0) {  // no images: the gradient is zero
    std::fill(dw, dw + wsize, 0.0f);
    return;
  }
  const int64_t G = static_cast<int64_t>(std::bit_floor(static_cast<uint64_t>(
      std::max<int64_t>(1, std::min({ch.count, kMaxGroups, kPartialFloats / std::max<int64_t>(wsize, 1)})))));
  Scratch<float> partials(c.workspace, G > 1 ? (G - 1) * wsize : 0);
  float* partial = partials.data();

  for_each_item(c, G, [&](const Ctx& gc, int64_t group) {
    float* out = group == 0 ? dw : partial + (group - 1) * wsize;
    const int64_t first = ch.count * group / G, last = ch.count * (group + 1) / G;
    for (int64_t i = first; i < last; ++i) {
      const int64_t n0 = ch.first(i), B = ch.first(i + 1) - n0;
      Scratch<T> col_buf(c.workspace, K * B * P), chunk_buf(c.workspace, B > 1 ? s.OC * B * P : 0);
      T* col = col_buf.data();
      im2col(g, x + n0 * x_img, B, col);
      const T* dyc = dy + n0 * y_img;
      if (B > 1) {
        to_chunk(dyc, B, s.OC, P, chunk_buf.data());
        dyc = chunk_buf.data();
      }
      gemm_of(gc, f, false, true, s.OC, K, B * P, 1.0f, dyc, col, i == first ? 0.0f : 1.0f, out);
    }
  });

  if (G == 1) return;
  c.parallel_for(wsize, [&](int64_t b, int64_t e) {
    for (int64_t group = 1; group < G; ++group) add_row(partial + (group - 1) * wsize + b, dw + b, e - b);
  });
}
void conv2d_backward_weight_im2col(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  backward_weight_im2col(c, Float16::bf16, s, x, dy, dw);
}
void conv2d16_backward_weight(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* x, const uint16_t* dy, float* dw) {
  backward_weight_im2col(c, f, s, x, dy, dw);
}

// ======== the choice: one place ========

static std::atomic<Conv2dKernel> g_conv2d_kernel{Conv2dKernel::automatic};  // the default: a member per shape
void set_conv2d_kernel(Conv2dKernel k) { g_conv2d_kernel.store(k, std::memory_order_relaxed); }
static std::atomic<Precision> g_precision{Precision::automatic};
void set_precision(Precision p) { g_precision.store(p, std::memory_order_relaxed); }
Precision precision() { return g_precision.load(std::memory_order_relaxed); }
Conv2dKernel conv2d_kernel() { return g_conv2d_kernel.load(std::memory_order_relaxed); }

// automatic's rule, from bench/conv2d_bench's tables (bench/README.md, "conv2d members": the figures
// live there, not here). Two facts decide it: how wide the GEMM's vectors are (gemm_vector_floats:
// kernel3's, the CPU's widest, unless --gemm picks OpenBLAS, whose kernel set may be SSE's 4 floats,
// as on a CPU it does not know), since kernel2 and kernel3 run on the GEMM; and how wide kernel4's are.
// - kernel4 blocked, when its vectors are wider than the GEMM's: against an SSE GEMM on every shape;
//   against a wider one only where C and OC fill its blocks (it lost on LeNet's few channels).
// - kernel3 F(4x4, 3x3), when the GEMM is as wide, on 3x3 stride-1 convs of 16+ channels with at
//   least one 4x4 output tile per channel: its filter transform and the alpha^2 GEMMs' packing of U
//   (alpha^2 * OC * C floats) are paid per call whatever the number of tiles, so it needs the tiles
//   to pay them back; with one input channel its GEMMs have K = 1. F(2x2, 3x3) won nowhere.
// - kernel2 im2col otherwise.
Conv2dKernel conv2d_auto_kernel(const Conv2dShape& s, int blocked_floats, int gemm_floats) {
  const int64_t blocked = blocked_floats, gemm = gemm_floats;
  if (blocked > gemm && (gemm == 4 || (s.C % blocked == 0 && s.OC % blocked == 0))) return Conv2dKernel::blocked;
  if (!conv2d_winograd_fits(s) || s.C < 16 || s.OC < 16) return Conv2dKernel::im2col;
  const int64_t tiles = s.N * ((s.OH() + 3) / 4) * ((s.OW() + 3) / 4);
  return tiles >= std::max(s.C, s.OC) ? Conv2dKernel::winograd : Conv2dKernel::im2col;
}
Conv2dKernel conv2d_auto_kernel(const Conv2dShape& s) {
  return conv2d_auto_kernel(s, vector_isa_floats(conv2d_blocked_isa()), gemm_vector_floats());
}

// The member that runs for s: the one chosen, or automatic's choice for s.
static Conv2dKernel member(const Conv2dShape& s) {
  const Conv2dKernel k = conv2d_kernel();
  return k == Conv2dKernel::automatic ? conv2d_auto_kernel(s) : k;
}

// Each member's three passes. Winograd does not pay for backward_weight (its "filter" would be dy,
// OH x OW): im2col's there.
using Pass = void (*)(const Ctx&, const Conv2dShape&, const float*, const float*, float*);
struct Passes {
  Pass forward, backward_data, backward_weight;
};
static Passes passes(Conv2dKernel k) {
  switch (k) {
    case Conv2dKernel::direct:
      return {conv2d_forward_direct, conv2d_backward_data_direct, conv2d_backward_weight_direct};
    case Conv2dKernel::winograd:
      return {conv2d_forward_winograd, conv2d_backward_data_winograd, conv2d_backward_weight_im2col};
    case Conv2dKernel::winograd2:
      return {conv2d_forward_winograd2, conv2d_backward_data_winograd2, conv2d_backward_weight_im2col};
    case Conv2dKernel::blocked:
      return {conv2d_forward_blocked, conv2d_backward_data_blocked, conv2d_backward_weight_blocked};
    default:
      return {conv2d_forward_im2col, conv2d_backward_data_im2col, conv2d_backward_weight_im2col};
  }
}

void conv2d_forward(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y) {
  passes(member(s)).forward(c, s, x, w, y);
}
void conv2d_backward_data(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx) {
  passes(member(s)).backward_data(c, s, dy, w, dx);
}
void conv2d_backward_weight(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw) {
  passes(member(s)).backward_weight(c, s, x, dy, dw);
}

}  // namespace d2l::kernels::cpu
