// sigmoid on every backend. The CPU kernel (kernels/cpu/sigmoid.cpp) against 1 / (1 + exp(-x)) in
// double, its backward against central finite differences of that double forward; inputs over
// [-20, 20] and out to +-1000 and +-inf, where a formula that overflows its exp would give NaN
// (exp(x) / (1 + exp(x))) or lose the tiny values. The emulated CUDA kernels (kernels/cuda/sigmoid.cu)
// bitwise against the CPU's, and their backward against finite differences of the emulated forward.
// The op (core/ops/sigmoid.cpp) through autograd.
#include <doctest/doctest.h>

#include <limits>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// y = 1 / (1 + exp(-x)), stable for large |x|; the backward reads the output y: dx = dy * y * (1 - y).
D2L_DECLARE_KERNEL(sigmoid_forward, const float* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(sigmoid_backward, const float* y, const float* dy, float* dx, int64_t n);

using namespace d2l::test;

namespace {
double ref_sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// lcg_data over [-20, 20), then the far ends: a saturated y and exp's overflow on either side.
Vec wide_data(int64_t n, uint32_t seed) {
  Vec x = lcg_data(n, seed);
  for (auto& v : x) v *= 20.0f;
  const float inf = std::numeric_limits<float>::infinity();
  const float ends[] = {-inf, -1000.0f, -100.0f, -87.0f, -30.0f, 0.0f, 30.0f, 89.0f, 100.0f, 1000.0f, inf};
  for (size_t i = 0; i < std::size(ends); ++i) x[i * x.size() / std::size(ends)] = ends[i];  // spread over x
  return x;
}

// L(x) = sum dy * sigmoid(x), in double.
std::function<double(const Vec&)> objective(const Vec& dy) {
  return [&dy](const Vec& xv) {
    double s = 0;
    for (size_t i = 0; i < xv.size(); ++i) s += dy[i] * ref_sigmoid(xv[i]);
    return s;
  };
}
}  // namespace

// Forward: a few ulp of float (rtol 1e-6 ~ 8 ulp), and atol 1e-44 for y(-100) = 3.7e-44, a denormal
// float. Backward from the float y: y * (1 - y) loses 1 - y to rounding as y nears 1, an absolute
// error below one ulp of 1 (6e-8) times |dy| <= 1, hence atol 1e-7.
TEST_CASE("sigmoid forward and backward against double, and finite differences") {
  double worst_fwd = 0, worst_bwd = 0;
  for_contexts_and_sizes([&](const cpu::Ctx& c, int64_t n) {
    Vec x = wide_data(n, 21), dy = lcg_data(n, 22), y(n), dx(n);
    std::vector<double> ref(n), dref(n);
    for (int64_t i = 0; i < n; ++i) ref[i] = ref_sigmoid(x[i]), dref[i] = dy[i] * ref[i] * (1.0 - ref[i]);
    cpu::sigmoid_forward(c, x.data(), y.data(), n);
    cpu::sigmoid_backward(c, y.data(), dy.data(), dx.data(), n);
    CHECK(close(ref, y, 1e-44, 1e-6, "sigmoid"));
    CHECK(close(dref, dx, 1e-7, 1e-5, "sigmoid_backward"));
    for (int64_t i = 0; i < n; ++i) {
      if (ref[i] >= std::numeric_limits<float>::min()) worst_fwd = std::max(worst_fwd, std::fabs(y[i] - ref[i]) / ref[i]);
      worst_bwd = std::max(worst_bwd, std::fabs(dx[i] - dref[i]));
    }
    // Finite differences where the inputs are finite and not saturated (|x| <= 20 here).
    Vec xs = lcg_data(n, 23), ys(n), dxs(n);
    for (auto& v : xs) v *= 8.0f;
    cpu::sigmoid_forward(c, xs.data(), ys.data(), n);
    cpu::sigmoid_backward(c, ys.data(), dy.data(), dxs.data(), n);
    CHECK(grad_ok(numeric_grad(xs, objective(dy)), dxs));
  });
  MESSAGE("worst relative error of the forward (normal floats) " << worst_fwd << ", absolute of the backward " << worst_bwd);
}

TEST_CASE("sigmoid at the far ends: 0 and 1 exactly, tiny values kept, never NaN") {
  const float inf = std::numeric_limits<float>::infinity();
  Vec x = {-inf, -1000.0f, -100.0f, 100.0f, 1000.0f, inf}, y(6), dx(6), ones(6, 1.0f);
  cpu::sigmoid_forward(cpu::serial_ctx(), x.data(), y.data(), 6);
  cpu::sigmoid_backward(cpu::serial_ctx(), y.data(), ones.data(), dx.data(), 6);
  CHECK(y[0] == 0.0f);
  CHECK(y[1] == 0.0f);
  CHECK(y[2] > 0.0f);  // 3.7e-44, a denormal float: 1 / (1 + exp(100)) would be 0 only through inf
  CHECK(y[3] == 1.0f);
  CHECK(y[4] == 1.0f);
  CHECK(y[5] == 1.0f);
  for (float g : dx) CHECK((g >= 0.0f && g < 1e-40f));  // y (1 - y): 0, or y itself when y is tiny
}

TEST_CASE("the gradient check rejects a wrong sigmoid gradient") {
  const int64_t n = 33;
  Vec x = lcg_data(n, 23), dy = lcg_data(n, 22), y(n), dx(n);
  for (auto& v : x) v *= 8.0f;
  cpu::sigmoid_forward(cpu::serial_ctx(), x.data(), y.data(), n);
  cpu::sigmoid_backward(cpu::serial_ctx(), y.data(), dy.data(), dx.data(), n);
  auto numeric = numeric_grad(x, objective(dy));
  check_grad_and_control(numeric, dx);
}

// ---- the emulated CUDA kernels. Bitwise: the same float operations in the same order (expf, not
// __expf; g++ does not contract a*b+c into an fma). n = 1, 7, 1000, 4099 (grid-stride tails).
namespace {
const Activation kSigmoid{"sigmoid", kemu::sigmoid_forward, kemu::sigmoid_backward, cpu::sigmoid_forward,
                          cpu::sigmoid_backward, true};
void check_emulated(kemu::Stream s) {
  check_activation_emulated(s, kSigmoid, [](int64_t n) {
    auto x = lcg_data(n, 2);  // over [-40, 40), saturated at both ends
    for (float& v : x) v *= 40.0f;
    return x;
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated sigmoid is bitwise the CPU's; n = 0 launches nothing",
                   "emulated sigmoid on 2 device threads", check_emulated)

TEST_CASE("emulated sigmoid_backward matches finite differences") {
  auto x = lcg_data(300, 32);
  for (float& v : x) v *= 8.0f;
  CHECK(activation_fd_ok(kSigmoid, x, lcg_data(300, 33)));  // FD tolerances: FdTol's (emu_check.hpp)
}

// ---- the op through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("sigmoid's backward matches finite differences; a broken one fails") {
  CHECK(op_case_ok({"sigmoid", {{{7}, grad_input(7, 22)}}, [](auto& x) { return project(d2l::sigmoid(x[0])); }},
                   d2l::cpu(0)));
}
