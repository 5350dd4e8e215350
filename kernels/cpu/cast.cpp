// cast: float32 into bfloat16 or float16 bits, rounded to nearest even, and back (exact); flat
// arrays of n, element by element with the reference conversions of float16.hpp.
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

template <class From, class To>
static void convert(const Ctx& c, const From* x, To* y, int64_t n, To (*f)(From)) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) y[i] = f(x[i]);
  });
}

void cast_to_bf16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { convert(c, x, y, n, bf16_from_float); }
void cast_to_f16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { convert(c, x, y, n, f16_from_float); }
void cast_from_bf16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { convert(c, x, y, n, float_from_bf16); }
void cast_from_f16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { convert(c, x, y, n, float_from_f16); }

}  // namespace d2l::kernels::cpu
