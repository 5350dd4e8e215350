// sigmoid: y[i] = 1 / (1 + exp(-x[i]));  backward: dx[i] = dy[i] * y[i] * (1 - y[i])   (flat arrays of n)
// Stable for large |x|: exp is only ever taken of -|x| <= 0, so it lies in (0, 1] and never
// overflows; then y = 1 / (1 + e) for x >= 0 and y = e / (1 + e) for x < 0 (the same value,
// sigmoid(-t) = 1 - sigmoid(t), without forming 1 - y). The other textbook form, exp(x) / (1 + exp(x)),
// is inf / inf = NaN for x > 88 in float; this one gives 1 there, and tiny positive values far left.
// The backward reads the saved output y, not x (as relu's does): no exp, and x need not be kept.
// Where float rounds y to 1 (x > ~17) the gradient is 0 instead of < 6e-8: the same as PyTorch's.
#include <cmath>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

void sigmoid_forward(const Ctx& c, const float* x, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float t = std::exp(-std::fabs(x[i]));  // in (0, 1]
      y[i] = x[i] >= 0.0f ? 1.0f / (1.0f + t) : t / (1.0f + t);
    }
  });
}

void sigmoid_backward(const Ctx& c, const float* y, const float* dy, float* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = dy[i] * (y[i] * (1.0f - y[i]));
  });
}

}  // namespace d2l::kernels::cpu
