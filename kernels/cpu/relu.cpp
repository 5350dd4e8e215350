// relu: y[i] = max(x[i], 0);  backward: dx[i] = dy[i] if x[i] > 0 else 0   (flat arrays of n)
// Eight elements at a time in a fixed-length inner loop: at -O2 GCC vectorizes a loop only when it
// knows the trip count, and the select then compiles to a compare and a mask (no branch for the
// CPU to mispredict on half-positive data). The tail is the same formula one element at a time.
// relu16_* (activations16.cpp) do the same on the bits of autocast's 16-bit activations.
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void relu_forward(const Ctx& c, const float* x, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      float v[8];
      for (int j = 0; j < 8; ++j) v[j] = x[i + j];
      for (int j = 0; j < 8; ++j) y[i + j] = v[j] > 0.0f ? v[j] : 0.0f;
    }
    for (; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void relu_backward(const Ctx& c, const float* x, const float* dy, float* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      float v[8], g[8];
      for (int j = 0; j < 8; ++j) v[j] = x[i + j], g[j] = dy[i + j];
      for (int j = 0; j < 8; ++j) dx[i + j] = v[j] > 0.0f ? g[j] : 0.0f;
    }
    for (; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  });
}

}  // namespace d2l::kernels::cpu
