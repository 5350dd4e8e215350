// sgd_update: w[i] -= lr * g[i] for i < n (lr already divided by the batch size by the caller).
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void sgd_update(const Ctx& c, float* w, const float* g, int64_t n, float lr) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) w[i] -= lr * g[i];
  });
}

}  // namespace d2l::kernels::cpu
