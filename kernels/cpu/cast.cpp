// cast: float32 into bfloat16 or float16 bits, rounded to nearest even, and back (exact); flat
// arrays of n, element by element with the reference conversions of float16.hpp. The loop
// (cast_loops.hpp) is built for AVX-512, AVX2 and any x86-64 (per_isa.hpp) at -O3 (meson.build):
// rounding a float32 to 16 bits is an add, a shift and a select, which vectorise only with the wider
// instruction sets, and loops of unknown length only at -O3.
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {
#define D2L_PER_ISA_LOOPS "cast_loops.hpp"
#include "per_isa.hpp"
}  // namespace

void cast_to_bf16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { D2L_ON_BEST_ISA(convert<bf16_from_float>(c, x, y, n)); }
void cast_to_f16(const Ctx& c, const float* x, uint16_t* y, int64_t n) { D2L_ON_BEST_ISA(convert<f16_from_float>(c, x, y, n)); }
void cast_from_bf16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { D2L_ON_BEST_ISA(convert<float_from_bf16>(c, x, y, n)); }
void cast_from_f16(const Ctx& c, const uint16_t* x, float* y, int64_t n) { D2L_ON_BEST_ISA(convert<float_from_f16>(c, x, y, n)); }

}  // namespace d2l::kernels::cpu
