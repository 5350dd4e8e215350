// add: y = a + b;  axpy: y += alpha * x;  mul: y = a * b   (elementwise over n floats)
// add16: y = a + b over 16-bit bits (bfloat16 or float16): widened, added in float32, rounded once
// (autocast's residual additions on CPU devices).
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {
template <class V>
void add_elements(const Ctx& c, const typename V::T* a, const typename V::T* b, typename V::T* y, int64_t n) {
  c.parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = V::put(V::get(a[i]) + V::get(b[i]));
  });
}
}  // namespace

void add(const Ctx& c, const float* a, const float* b, float* y, int64_t n) { add_elements<AsF32>(c, a, b, y, n); }

void add16(const Ctx& c, Float16 f, const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n) {
  if (f == Float16::bf16) add_elements<As16<Float16::bf16>>(c, a, b, y, n);
  else add_elements<As16<Float16::f16>>(c, a, b, y, n);
}

void axpy(const Ctx& c, float alpha, const float* x, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] += alpha * x[i];
  });
}

void mul(const Ctx& c, const float* a, const float* b, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) y[i] = a[i] * b[i];
  });
}

}  // namespace d2l::kernels::cpu
