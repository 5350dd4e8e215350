// relu: y[i] = max(x[i], 0);  backward: dx[i] = dy[i] if x[i] > 0 else 0   (flat arrays of n)
// Eight elements at a time in a fixed-length inner loop: at -O2 GCC vectorizes a loop only when it
// knows the trip count, and the select then compiles to a compare and a mask (no branch for the
// CPU to mispredict on half-positive data). The tail is the same formula one element at a time.
// relu16_*: the same on the bits of autocast's 16-bit activations on CPU devices (max(x, 0) and a
// selected dy are values of the format already: nothing to round).
#include "kernels.hpp"

namespace d2l::kernels::cpu {

void relu_forward(const Ctx& c, const float* x, float* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      float v[8];
      for (int j = 0; j < 8; ++j) v[j] = x[i + j];
      for (int j = 0; j < 8; ++j) y[i + j] = v[j] > 0.0f ? v[j] : 0.0f;
    }
    for (; i < e; ++i) y[i] = x[i] > 0.0f ? x[i] : 0.0f;
  });
}

void relu_backward(const Ctx& c, const float* x, const float* dy, float* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    int64_t i = b;
    for (; i + 8 <= e; i += 8) {
      float v[8], g[8];
      for (int j = 0; j < 8; ++j) v[j] = x[i + j], g[j] = dy[i + j];
      for (int j = 0; j < 8; ++j) dx[i + j] = v[j] > 0.0f ? g[j] : 0.0f;
    }
    for (; i < e; ++i) dx[i] = x[i] > 0.0f ? dy[i] : 0.0f;
  });
}

// On 16-bit bits the test x > 0 needs no widening: x is above zero exactly when its bits lie in
// [1, +infinity's] (sign clear, not zero, not a NaN). An integer compare and a select, which the
// compiler vectorises; the same results as the float32 kernels give on the widened values
// (tests/test_activations16.cpp).
namespace {
template <uint16_t kInf>
void forward_bits(const Ctx& c, const uint16_t* x, uint16_t* y, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    auto one = [&](int64_t i) { y[i] = static_cast<uint16_t>(x[i] - 1u) < kInf ? x[i] : uint16_t{0}; };
    int64_t i = b;
    for (; i + 16 <= e; i += 16)  // a fixed-length loop, as above: what -O2 vectorises
      for (int j = 0; j < 16; ++j) one(i + j);
    for (; i < e; ++i) one(i);
  });
}
template <uint16_t kInf>
void backward_bits(const Ctx& c, const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    auto one = [&](int64_t i) { dx[i] = static_cast<uint16_t>(x[i] - 1u) < kInf ? dy[i] : uint16_t{0}; };
    int64_t i = b;
    for (; i + 16 <= e; i += 16)
      for (int j = 0; j < 16; ++j) one(i + j);
    for (; i < e; ++i) one(i);
  });
}
}  // namespace

void relu16_forward(const Ctx& c, Float16 f, const uint16_t* x, uint16_t* y, int64_t n) {
  if (f == Float16::bf16) forward_bits<0x7F80>(c, x, y, n);
  else forward_bits<0x7C00>(c, x, y, n);
}

void relu16_backward(const Ctx& c, Float16 f, const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n) {
  if (f == Float16::bf16) backward_bits<0x7F80>(c, x, dy, dx, n);
  else backward_bits<0x7C00>(c, x, dy, dx, n);
}

}  // namespace d2l::kernels::cpu
