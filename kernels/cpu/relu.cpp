// relu: y[i] = max(x[i], 0);  backward: dx[i] = dy[i] if x[i] > 0 else 0   (flat arrays of n)
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void relu_forward(const Ctx& c, const float* x, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void relu_backward(const Ctx& c, const float* x, const float* dy, float* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  });
}

}  // namespace d2l::kernels::cpu
