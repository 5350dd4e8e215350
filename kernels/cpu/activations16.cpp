// The 16-bit activations' kernels (kernels.hpp: relu16_*, add16, bias_add16_*, max_pool2d16_*,
// batch_norm16_*): activation_loops.hpp's loops, the float32 kernels' own, over bfloat16 or float16
// bits. Each is compiled three times, for AVX-512, for AVX2 and for any x86-64 (per_isa.hpp, as GEMM
// kernel3 is in gemm_packed.cpp), and the best set this CPU has runs: widening a 16-bit value is a shift and
// rounding one an add, a shift and a select, which vectorise only with the wider instruction sets
// (the baseline's SSE2 lacks the 32-to-16-bit packs). This file is built at -O3 (meson.build): the
// loops of unknown length (a channel's values) are vectorised there, not at -O2. Floating-point
// contraction stays off (ISO C++), so every set computes the float32 kernels' bits.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "batch_norm_channel.hpp"
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

#define D2L_PER_ISA_LOOPS "activation_loops.hpp"
#include "per_isa.hpp"

using Bf16 = As16<Float16::bf16>;
using F16 = As16<Float16::f16>;

}  // namespace

void relu16_forward(const Ctx& c, Float16 f, const uint16_t* x, uint16_t* y, int64_t n) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(relu_bits_forward<0x7F80>(c, x, y, n));
  else D2L_ON_BEST_ISA(relu_bits_forward<0x7C00>(c, x, y, n));
}

void relu16_backward(const Ctx& c, Float16 f, const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(relu_bits_backward<0x7F80>(c, x, dy, dx, n));
  else D2L_ON_BEST_ISA(relu_bits_backward<0x7C00>(c, x, dy, dx, n));
}

void add16(const Ctx& c, Float16 f, const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(add_elements<Bf16>(c, a, b, y, n));
  else D2L_ON_BEST_ISA(add_elements<F16>(c, a, b, y, n));
}

void bias_add16_forward(const Ctx& c, Float16 f, const uint16_t* x, const float* b, uint16_t* y, int64_t outer, int64_t C,
                        int64_t inner) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(bias_forward<Bf16>(c, x, b, y, outer, C, inner));
  else D2L_ON_BEST_ISA(bias_forward<F16>(c, x, b, y, outer, C, inner));
}

void bias_add16_backward(const Ctx& c, Float16 f, const uint16_t* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(bias_backward<Bf16>(c, dy, db, outer, C, inner));
  else D2L_ON_BEST_ISA(bias_backward<F16>(c, dy, db, outer, C, inner));
}

void max_pool2d16_forward(const Ctx& c, Float16 f, const Pool2dShape& s, const uint16_t* x, uint16_t* y, int32_t* argmax) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(max_pool_forward<Bf16>(c, s, x, y, argmax));
  else D2L_ON_BEST_ISA(max_pool_forward<F16>(c, s, x, y, argmax));
}

void max_pool2d16_backward(const Ctx& c, Float16 f, const Pool2dShape& s, const uint16_t* dy, const int32_t* argmax,
                           uint16_t* dx) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(max_pool_backward<Bf16>(c, s, dy, argmax, dx));
  else D2L_ON_BEST_ISA(max_pool_backward<F16>(c, s, dy, argmax, dx));
}

void batch_norm16_train_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                                const float* gamma, const float* beta, float eps, float momentum, uint16_t* y,
                                float* mean, float* invstd, float* running_mean, float* running_var) {
  if (f == Float16::bf16)
    D2L_ON_BEST_ISA(bn_train_forward<Bf16>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var));
  else
    D2L_ON_BEST_ISA(bn_train_forward<F16>(c, N, C, HW, x, gamma, beta, eps, momentum, y, mean, invstd, running_mean, running_var));
}

void batch_norm16_eval_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                               const float* gamma, const float* beta, const float* running_mean,
                               const float* running_var, float eps, uint16_t* y) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(bn_eval_forward<Bf16>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y));
  else D2L_ON_BEST_ISA(bn_eval_forward<F16>(c, N, C, HW, x, gamma, beta, running_mean, running_var, eps, y));
}

void batch_norm16_backward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                           const uint16_t* dy, const float* gamma, const float* mean, const float* invstd, uint16_t* dx,
                           float* dgamma, float* dbeta) {
  if (f == Float16::bf16) D2L_ON_BEST_ISA(bn_backward<Bf16>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta));
  else D2L_ON_BEST_ISA(bn_backward<F16>(c, N, C, HW, x, dy, gamma, mean, invstd, dx, dgamma, dbeta));
}

}  // namespace d2l::kernels::cpu
