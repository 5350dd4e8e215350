// add: y = a + b;  axpy: y += alpha * x;  mul: y = a * b   (elementwise over n floats)
// add's loop is activation_loops.hpp's, shared with the 16-bit activations (activations16.cpp).
#include "activation_loops_once.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void add(const Ctx& c, const float* a, const float* b, float* y, int64_t n) { loops::add_elements<AsF32>(c, a, b, y, n); }
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
