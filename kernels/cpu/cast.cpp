// cast: float32 into bfloat16 or float16 bits, rounded to nearest even, and back (exact); flat
// arrays of n, element by element with the reference conversions of float16.hpp. Each conversion is
// a template argument, so that it is inlined into the loop (a call per element through a pointer
// cost a fifth of a bfloat16 training step).
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

template <auto f, class From, class To>
static void convert(const Ctx& c, const From* x, To* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}

void cast_to_bf16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { convert<bf16_from_float>(c, x, y, n); }
void cast_to_f16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { convert<f16_from_float>(c, x, y, n); }
void cast_from_bf16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { convert<float_from_bf16>(c, x, y, n); }
void cast_from_f16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { convert<float_from_f16>(c, x, y, n); }

}  // namespace d2l::kernels::cpu
