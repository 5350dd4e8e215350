// bias_add: x, y viewed as (outer, C, inner); y[o][c][i] = x[o][c][i] + b[c].
// backward: db[c] = sum over o and i of dy[o][c][i]   (dx = dy is the caller's copy)
// The inner loops go eight elements at a time with a fixed-length loop: that is what GCC vectorizes
// at -O2 (it leaves loops of unknown length scalar). The loops are activation_loops.hpp's, shared
// with the 16-bit activations (activations16.cpp).
#include "activation_loops_once.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void bias_add_forward(const Ctx& c, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner) {
  loops::bias_forward<AsF32>(c, x, b, y, outer, C, inner);
}

void bias_add_backward(const Ctx& c, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner) {
  loops::bias_backward<AsF32>(c, dy, db, outer, C, inner);
}

}  // namespace d2l::kernels::cpu
