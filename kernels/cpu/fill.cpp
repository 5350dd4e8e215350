// fill: x[i] = value;  copy: dst[i] = src[i];  scale: y[i] = alpha * x[i]   (i < n, flat arrays)
#include <cstring>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

void fill(const Ctx& c, float* x, int64_t n, float value) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] = value;
  });
}

void copy(const Ctx& c, const float* src, float* dst, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    std::memcpy(dst + b, src + b, static_cast<size_t>(e - b) * sizeof(float));
  });
}

void scale(const Ctx& c, const float* x, float* y, int64_t n, float alpha) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = alpha * x[i];
  });
}

}  // namespace d2l::kernels::cpu
