// Direct loops in double for the benchmarks' validation: a ResNet block's convolution (square input
// and kernel) and BatchNorm in training mode with gamma 1, beta 0, an optional relu; LeNet's and the
// lab CNN's convolution, relu and pooling, and their dense layers.
#pragma once
#include <algorithm>
#include <cmath>
#include <vector>

namespace d2l::bench::bench_ref {

using Vec = std::vector<double>;
inline Vec ref_conv(const Vec& x, int N, int C, int H, const std::vector<float>& w, const std::vector<float>& bias, int OC, int K,
             int stride, int pad, int* OHp) {
  const int OH = (H + 2 * pad - K) / stride + 1;
  Vec y(static_cast<size_t>(N * OC * OH * OH));
  for (int n = 0; n < N; ++n)
    for (int oc = 0; oc < OC; ++oc)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OH; ++ow) {
          double acc = bias[oc];
          for (int c = 0; c < C; ++c)
            for (int kh = 0; kh < K; ++kh)
              for (int kw = 0; kw < K; ++kw) {
                const int ih = oh * stride - pad + kh, iw = ow * stride - pad + kw;
                if (ih >= 0 && ih < H && iw >= 0 && iw < H) acc += x[((n * C + c) * H + ih) * H + iw] * w[((oc * C + c) * K + kh) * K + kw];
              }
          y[((n * OC + oc) * OH + oh) * OH + ow] = acc;
        }
  *OHp = OH;
  return y;
}
inline Vec ref_bn(const Vec& x, int N, int C, int HW, bool relu) {  // training mode, gamma 1, beta 0, eps 1e-5
  Vec y(x.size());
  for (int c = 0; c < C; ++c) {
    double mean = 0, var = 0;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) mean += x[(n * C + c) * HW + i];
    mean /= N * HW;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) var += std::pow(x[(n * C + c) * HW + i] - mean, 2);
    var /= N * HW;
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < HW; ++i) {
        const double v = (x[(n * C + c) * HW + i] - mean) / std::sqrt(var + 1e-5);
        y[(n * C + c) * HW + i] = relu && v < 0 ? 0 : v;
      }
  }
  return y;
}

// The largest relative error, |want - got| / (1e-3 + |want|), of `got` against a downsampling
// residual block on x (N, C, H, H) in double: conv1 (3x3, stride 2, pad 1), BatchNorm, relu, conv2
// (3x3, pad 1), BatchNorm; shortcut conv3 (1x1, stride 2); their sum through relu. wb holds conv1's
// weight and bias, then conv2's, then conv3's.
inline double residual_block_error(const std::vector<float>& xs, int N, int C, int H, int OC,
                                   const std::vector<std::vector<float>>& wb, const std::vector<float>& got) {
  int OH = 0;
  const Vec x(xs.begin(), xs.end());
  Vec y = ref_conv(x, N, C, H, wb[0], wb[1], OC, 3, 2, 1, &OH);  // sets OH: its own statement
  y = ref_bn(y, N, OC, OH * OH, true);
  y = ref_conv(y, N, OC, OH, wb[2], wb[3], OC, 3, 1, 1, &OH);
  y = ref_bn(y, N, OC, OH * OH, false);
  const Vec shortcut = ref_conv(x, N, C, H, wb[4], wb[5], OC, 1, 2, 0, &OH);
  double worst = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    const double want = std::max(0.0, y[i] + shortcut[i]);
    worst = std::max(worst, std::fabs(want - got[i]) / (1e-3 + std::fabs(want)));
  }
  return worst;
}

// One image (C, H, H) through a valid (no padding, stride 1) KxK convolution with bias and relu, then
// a 2x2 stride-2 pool: max (the lab's CNN), or average (the book's LeNet). Returns (OC, PH, PH),
// PH = (H - K + 1) / 2, in *out_h.
inline Vec conv_relu_pool(const Vec& x, int C, int H, const std::vector<float>& w, const std::vector<float>& bias,
                          int OC, int K, bool average, int* out_h) {
  int OH = 0;
  Vec conv = ref_conv(x, 1, C, H, w, bias, OC, K, 1, 0, &OH);  // OH = H - K + 1
  for (double& v : conv) v = v > 0 ? v : 0;
  const int PH = OH / 2;
  Vec pooled(static_cast<size_t>(OC * PH * PH), average ? 0.0 : -1e300);
  for (int oc = 0; oc < OC; ++oc)
    for (int ph = 0; ph < PH; ++ph)
      for (int pw = 0; pw < PH; ++pw)
        for (int i = 0; i < 4; ++i) {
          double& p = pooled[(oc * PH + ph) * PH + pw];
          const double v = conv[(oc * OH + 2 * ph + i / 2) * OH + 2 * pw + i % 2];
          p = average ? p + v / 4 : std::max(p, v);
        }
  *out_h = PH;
  return pooled;
}

// One example through a dense layer, y = W x + bias, then relu where asked. W is stored (out, in), as
// Gluon and PyTorch store it, or (in, out): x @ W, the book's torch.mm from scratch.
enum class WeightLayout { out_in, in_out };
inline Vec dense(const Vec& x, const std::vector<float>& w, const std::vector<float>& bias, int in, int out, bool relu,
                 WeightLayout layout) {
  Vec y(static_cast<size_t>(out));
  for (int j = 0; j < out; ++j) {
    double acc = bias[j];
    for (int i = 0; i < in; ++i) acc += x[i] * w[layout == WeightLayout::out_in ? j * in + i : i * out + j];
    y[j] = relu && acc < 0 ? 0 : acc;
  }
  return y;
}

}  // namespace d2l::bench::bench_ref
