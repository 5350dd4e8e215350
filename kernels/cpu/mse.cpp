// mse (d2l's squared_loss), elementwise over n: l[i] = (p[i] - t[i])^2 / 2;
// backward: dp[i] = dl[i] * (p[i] - t[i]).
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void mse_forward(const Ctx& c, const float* p, const float* t, float* l, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const float d = p[i] - t[i];
      l[i] = 0.5f * d * d;
    }
  });
}

void mse_backward(const Ctx& c, const float* p, const float* t, const float* dl, float* dp, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) dp[i] = dl[i] * (p[i] - t[i]);
  });
}

}  // namespace d2l::kernels::cpu
