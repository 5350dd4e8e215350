// Direct loops in double for the benchmarks' validation of a ResNet block: convolution (square
// input and kernel) and BatchNorm in training mode with gamma 1, beta 0, an optional relu.
#pragma once
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

}  // namespace d2l::bench::bench_ref
