// The loops of the ops whose activations autocast keeps in 16 bits on CPU devices (bias_add, relu,
// add, max-pooling, BatchNorm), written once over the element type V of float16.hpp: each element read
// as float32 (exactly), computed as in float32, each output written once (a 16-bit format rounded to
// nearest even). The float32 kernels (bias_add.cpp, add.cpp, pool2d.cpp, batch_norm.cpp) instantiate
// them with AsF32; activations16.cpp with the 16-bit formats, compiled for each vector instruction
// set (its widenings and roundings then vectorise) and chosen at run time. No include guard on purpose:
// each includer puts the templates in a namespace of its own (gemm_packed_loops.hpp does the same).
// The includer has included <algorithm>, <cmath>, <type_traits>, <vector>, "batch_norm_channel.hpp",
// "float16.hpp" and "kernels.hpp" before, in namespace d2l::kernels::cpu.

// ---- relu on 16-bit bits: x is above zero exactly when its bits lie in [1, +infinity's] (sign clear,
// not zero, not a NaN); nothing to round. kInf: +infinity's bits (bfloat16 0x7F80, float16 0x7C00).
template <uint16_t kInf>
void relu_bits_forward(const Ctx& c, const uint16_t* x, uint16_t* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    auto one = [&](int64_t i) { y[i] = static_cast<uint16_t>(x[i] - 1u) < kInf ? x[i] : uint16_t{0}; };
    int64_t i = b;
    for (; i + 16 <= e; i += 16)  // a fixed-length inner loop: what -O2 vectorises (relu.cpp)
      for (int j = 0; j < 16; ++j) one(i + j);
    for (; i < e; ++i) one(i);
  });
}
template <uint16_t kInf>
void relu_bits_backward(const Ctx& c, const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    auto one = [&](int64_t i) { dx[i] = static_cast<uint16_t>(x[i] - 1u) < kInf ? dy[i] : uint16_t{0}; };
    int64_t i = b;
    for (; i + 16 <= e; i += 16)
      for (int j = 0; j < 16; ++j) one(i + j);
    for (; i < e; ++i) one(i);
  });
}
// ---- add: y = a + b
template <class V>
void add_elements(const Ctx& c, const typename V::T* a, const typename V::T* b, typename V::T* y, int64_t n) {
  c.parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = V::put(V::get(a[i]) + V::get(b[i]));
  });
}
// ---- bias_add: x, y viewed as (outer, C, inner); y = x + b[c]; db[c] = the sum of dy over o and i
template <class V>
void bias_forward(const Ctx& c, const typename V::T* x, const float* b, typename V::T* y, int64_t outer, int64_t C,
             int64_t inner) {
  // One "row" = one (o, c) pair: inner contiguous elements sharing the bias b[c].
  c.parallel_for(outer * C, [&](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float bias = b[r % C];
      const typename V::T* xr = x + r * inner;
      typename V::T* yr = y + r * inner;
      int64_t i = 0;
      for (; i + 8 <= inner; i += 8) {
        float v[8];
        for (int j = 0; j < 8; ++j) v[j] = V::get(xr[i + j]) + bias;
        for (int j = 0; j < 8; ++j) yr[i + j] = V::put(v[j]);
      }
      for (; i < inner; ++i) yr[i] = V::put(V::get(xr[i]) + bias);
    }
  });
}

template <class V>
void bias_backward(const Ctx& c, const typename V::T* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  // Split over channels: each db[c] is summed by one thread in a fixed order, in double, so the
  // result does not depend on the thread count. Four running sums (element i of a row goes to sum
  // i % 4, the tail to sum 0) instead of one: the additions no longer wait for each other.
  c.parallel_for(C, [&](int64_t lo, int64_t hi) {
    for (int64_t ch = lo; ch < hi; ++ch) {
      double s0 = 0, s1 = 0, s2 = 0, s3 = 0;
      for (int64_t o = 0; o < outer; ++o) {
        const typename V::T* row = dy + (o * C + ch) * inner;
        int64_t i = 0;
        for (; i + 4 <= inner; i += 4) {
          s0 += V::get(row[i]);
          s1 += V::get(row[i + 1]);
          s2 += V::get(row[i + 2]);
          s3 += V::get(row[i + 3]);
        }
        for (; i < inner; ++i) s0 += V::get(row[i]);
      }
      db[ch] = static_cast<float>((s0 + s1) + (s2 + s3));
    }
  });
}

// ---- batch normalisation (batch_norm.cpp's formulas); the statistics and parameters are float32
template <class V>
void bn_train_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const float* gamma,
                   const float* beta, float eps, float momentum, typename V::T* y, float* mean, float* invstd,
                   float* running_mean, float* running_var) {
  const int64_t M = N * HW;
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const ChannelMoments mo = channel_moments<V>(N, C, HW, x, ch);  // two passes in double
      const double mu = mo.mean, sq = mo.sq;
      const double var = sq / static_cast<double>(M);
      const double istd = 1.0 / std::sqrt(var + static_cast<double>(eps));

      const float m = static_cast<float>(mu);  // y = scale * (x - mean) + beta
      channel_normalize<V>(N, C, HW, x, ch, static_cast<float>(gamma[ch] * istd), m, beta[ch], y);

      mean[ch] = m;
      invstd[ch] = static_cast<float>(istd);
      const double unbiased = M > 1 ? sq / static_cast<double>(M - 1) : var;
      running_mean[ch] = static_cast<float>((1.0 - momentum) * running_mean[ch] + momentum * mu);
      running_var[ch] = static_cast<float>((1.0 - momentum) * running_var[ch] + momentum * unbiased);
    }
  });
}

template <class V>
void bn_eval_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const float* gamma,
                  const float* beta, const float* running_mean, const float* running_var, float eps, typename V::T* y) {
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const float scale =
          static_cast<float>(gamma[ch] / std::sqrt(static_cast<double>(running_var[ch]) + eps));
      channel_normalize<V>(N, C, HW, x, ch, scale, running_mean[ch], beta[ch], y);
    }
  });
}

template <class V>
void bn_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const typename V::T* x, const typename V::T* dy,
              const float* gamma, const float* mean, const float* invstd, typename V::T* dx, float* dgamma, float* dbeta) {
  const int64_t M = N * HW;
  c.parallel_for(C, [&](int64_t begin, int64_t end) {
    for (int64_t ch = begin; ch < end; ++ch) {
      const double mu = mean[ch], istd = invstd[ch];
      const ChannelGradSums g = channel_grad_sums<V>(N, C, HW, x, dy, ch, mu, istd);
      const double sum_dy = g.dy, sum_dy_xhat = g.dy_xhat;
      dbeta[ch] = static_cast<float>(sum_dy);
      dgamma[ch] = static_cast<float>(sum_dy_xhat);

      // dx = gamma * invstd / M * (M * dy - sum_dy - xhat * sum_dy_xhat)
      const double k1 = gamma[ch] * istd / static_cast<double>(M);
      for (int64_t n = 0; n < N; ++n)
        for (int64_t i = 0; i < HW; ++i) {
          const int64_t k = (n * C + ch) * HW + i;
          const double xhat = (V::get(x[k]) - mu) * istd;
          dx[k] = V::put(static_cast<float>(k1 * (static_cast<double>(M) * V::get(dy[k]) - sum_dy - xhat * sum_dy_xhat)));
        }
    }
  });
}

// ---- max-pooling (pool2d.cpp's rules); backward sums a 16-bit plane's gradients in float32
template <class V>
void max_pool_forward(const Ctx& c, const Pool2dShape& s, const typename V::T* x, typename V::T* y, int32_t* argmax) {
  const int64_t OH = s.OH(), OW = s.OW();
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const typename V::T* xp = x + p * s.H * s.W;
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const int64_t h0 = oh * s.stride_h - s.pad_h, w0 = ow * s.stride_w - s.pad_w;
          float best = 0.0f;
          int64_t best_i = -1;
          for (int64_t ih = std::max<int64_t>(h0, 0); ih < std::min(h0 + s.KH, s.H); ++ih)
            for (int64_t iw = std::max<int64_t>(w0, 0); iw < std::min(w0 + s.KW, s.W); ++iw) {
              const float v = V::get(xp[ih * s.W + iw]);
              // strictly greater: the first maximum wins ties; the first NaN wins over numbers
              if (best_i < 0 || v > best || (std::isnan(v) && !std::isnan(best))) {
                best = v;
                best_i = ih * s.W + iw;
              }
            }
          const int64_t o = p * OH * OW + oh * OW + ow;
          y[o] = V::put(best);
          argmax[o] = static_cast<int32_t>(best_i);
        }
    }
  });
}

template <class V>
void max_pool_backward(const Ctx& c, const Pool2dShape& s, const typename V::T* dy, const int32_t* argmax, typename V::T* dx) {
  const int64_t P = s.OH() * s.OW(), HW = s.H * s.W;
  constexpr bool f32 = std::is_same_v<V, AsF32>;
  c.parallel_for(s.N * s.C, [&](int64_t begin, int64_t end) {
    std::vector<float> plane(f32 ? 0 : static_cast<size_t>(HW));  // a 16-bit plane's float32 sums
    for (int64_t p = begin; p < end; ++p) {
      float* acc = f32 ? reinterpret_cast<float*>(dx + p * HW) : plane.data();
      std::fill(acc, acc + HW, 0.0f);
      for (int64_t o = p * P; o < (p + 1) * P; ++o)
        if (argmax[o] >= 0) acc[argmax[o]] += V::get(dy[o]);
      if constexpr (!f32)
        for (int64_t i = 0; i < HW; ++i) dx[p * HW + i] = V::put(acc[i]);
    }
  });
}

