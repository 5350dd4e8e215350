// Pooling on every backend: the CPU kernels (kernels/cpu/pool2d.cpp) against direct window loops in
// double, and their backward passes against central finite differences of those references; 1, 2 and
// 3 threads. The emulated CUDA kernels (kernels/cuda/pool2d.cu) against the CPU's, and their backward
// passes against finite differences of the emulated forward (a gradient x1.05 must fail the same check).
// Tolerances of the emulated kernels (d2l::test::close: |ref - x| <= atol + rtol |ref|; data in [-1, 1)):
//   bitwise       max pool forward and argmax (a selection), global avg pool backward
//   1e-6/1e-5     float sums of a few terms whose order the CPU is free to change: max/avg pool
//                 backward (windows overlapping an input), avg pool forward
//   1e-6/1e-6     global avg pool forward (double sums, another order)
//   FD            atol 1e-3, rtol 1e-2 (FdTol, tests/emu_check.hpp); h 5e-2 for linear maps, 1e-3 for
//                 max pooling on values 0.01 apart (no step changes a window's winner)
#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"

// x (N, C, H, W) -> y (N, C, OH, OW) (Pool2dShape, kernels/cpu/kernels.hpp). Padding never wins a max;
// max keeps argmax (flat h*W + w in its plane); average divides by KH*KW (padding counted, as
// PyTorch's and MXNet's defaults). Global average pool: x (N, C, HW) -> y (N, C). dx overwritten.
D2L_DECLARE_KERNEL(max_pool2d_forward, const Pool2dShape& s, const float* x, float* y, int32_t* argmax);
D2L_DECLARE_KERNEL(max_pool2d_backward, const Pool2dShape& s, const float* dy, const int32_t* argmax, float* dx);
D2L_DECLARE_KERNEL(avg_pool2d_forward, const Pool2dShape& s, const float* x, float* y);
D2L_DECLARE_KERNEL(avg_pool2d_backward, const Pool2dShape& s, const float* dy, float* dx);
D2L_DECLARE_KERNEL(global_avg_pool_forward, int64_t N, int64_t C, int64_t HW, const float* x, float* y);
D2L_DECLARE_KERNEL(global_avg_pool_backward, int64_t N, int64_t C, int64_t HW, const float* dy, float* dx);

using d2l::kernels::cpu::Ctx;
using d2l::kernels::cpu::Pool2dShape;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

// {N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w}
const std::vector<Pool2dShape> kShapes = {
    {1, 1, 7, 5, 3, 3, 2, 2, 1, 1},    // ResNet's 3x3/2 pad 1 max pool, batch 1, one channel
    {2, 3, 13, 11, 3, 3, 2, 2, 1, 1},  // the same on more planes
    {1, 1, 7, 5, 2, 2, 2, 2, 0, 0},    // LeNet's 2x2/2 on odd sizes: the last row/column dropped
    {2, 2, 13, 11, 3, 3, 2, 2, 0, 0},  // AlexNet's overlapping 3x3/2
    {2, 3, 9, 8, 3, 3, 1, 1, 1, 1},    // stride 1: every input in up to 9 windows
    {3, 2, 11, 7, 3, 2, 2, 1, 1, 0},   // non-square kernel and stride
    {2, 2, 10, 9, 5, 5, 3, 3, 2, 2},   // 5x5/3 pad 2
    {1, 4, 6, 5, 6, 5, 1, 1, 0, 0},    // window = whole image
    {5, 1, 8, 7, 1, 1, 1, 1, 0, 0},    // 1x1: identity
    {2, 2, 5, 5, 2, 2, 1, 1, 1, 1},    // 2x2 pad 1: corner windows hold one image value
};

std::string describe(const Pool2dShape& s) {
  char b[160];
  std::snprintf(b, sizeof b, "N%lld C%lld %lldx%lld k%lldx%lld s%lld,%lld p%lld,%lld", (long long)s.N,
                (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.KH, (long long)s.KW,
                (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h, (long long)s.pad_w);
  return b;
}
int64_t x_size(const Pool2dShape& s) { return s.N * s.C * s.H * s.W; }
int64_t y_size(const Pool2dShape& s) { return s.N * s.C * s.OH() * s.OW(); }

// Calls f(o, i) for every output o and every image (non-padding) input i of its window, i being the
// flat index into x, in row-major window order.
template <class F>
void for_windows(const Pool2dShape& s, F f) {
  for (int64_t p = 0; p < s.N * s.C; ++p)
    for (int64_t oh = 0; oh < s.OH(); ++oh)
      for (int64_t ow = 0; ow < s.OW(); ++ow)
        for (int64_t kh = 0; kh < s.KH; ++kh)
          for (int64_t kw = 0; kw < s.KW; ++kw) {
            int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
            if (ih >= 0 && ih < s.H && iw >= 0 && iw < s.W)
              f((p * s.OH() + oh) * s.OW() + ow, (p * s.H + ih) * s.W + iw);
          }
}

// Max over the image values of each window (padding ignored); arg = flat index of the first max.
std::vector<double> ref_max(const Pool2dShape& s, const std::vector<double>& x,
                            std::vector<int64_t>* arg = nullptr) {
  std::vector<double> y(static_cast<size_t>(y_size(s)), -INFINITY);
  std::vector<int64_t> a(y.size(), -1);
  for_windows(s, [&](int64_t o, int64_t i) {
    if (x[i] > y[o]) {  // strictly: the first maximum wins
      y[o] = x[i];
      a[o] = i % (s.H * s.W);
    }
  });
  if (arg) *arg = a;
  return y;
}

// Sum of each window's image values over KH*KW (padding counted as zeros).
std::vector<double> ref_avg(const Pool2dShape& s, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(y_size(s)), 0.0);
  for_windows(s, [&](int64_t o, int64_t i) { y[o] += x[i] / double(s.KH * s.KW); });
  return y;
}

// Inputs whose ±h perturbation could change some window's winner: within `margin` of a window max
// whose runner-up is within `margin` too. Finite differences are meaningless there.
std::vector<bool> near_ties(const Pool2dShape& s, const std::vector<float>& x, double margin) {
  std::vector<double> top(static_cast<size_t>(y_size(s)), -INFINITY), second(top);
  for_windows(s, [&](int64_t o, int64_t i) {
    if (x[i] > top[o]) {
      second[o] = top[o];
      top[o] = x[i];
    } else if (x[i] > second[o]) {
      second[o] = x[i];
    }
  });
  std::vector<bool> skip(x.size(), false);
  for_windows(s, [&](int64_t o, int64_t i) {
    if (top[o] - second[o] < margin && x[i] >= top[o] - margin) skip[i] = true;
  });
  return skip;
}

struct MaxOut {
  std::vector<float> y;
  std::vector<int32_t> arg;
};
MaxOut max_forward(const Ctx& c, const Pool2dShape& s, const std::vector<float>& x) {
  MaxOut m{std::vector<float>(y_size(s), -7.0f), std::vector<int32_t>(y_size(s), -7)};
  d2l::kernels::cpu::max_pool2d_forward(c, s, x.data(), m.y.data(), m.arg.data());
  return m;
}
std::vector<float> max_backward(const Ctx& c, const Pool2dShape& s, const std::vector<float>& dy,
                                const std::vector<int32_t>& arg) {
  std::vector<float> dx(x_size(s), -7.0f);  // garbage: backward overwrites
  d2l::kernels::cpu::max_pool2d_backward(c, s, dy.data(), arg.data(), dx.data());
  return dx;
}
std::vector<float> avg_backward(const Ctx& c, const Pool2dShape& s, const std::vector<float>& dy) {
  std::vector<float> dx(x_size(s), -7.0f);
  d2l::kernels::cpu::avg_pool2d_backward(c, s, dy.data(), dx.data());
  return dx;
}

}  // namespace

TEST_CASE("max_pool2d forward matches direct loops; padding never wins") {
  for (const auto& s : kShapes) {
    INFO(describe(s));
    for (float shift : {0.0f, -2.0f}) {  // -2: every value negative, so a zero from padding would win
      auto x = lcg_data(x_size(s), 1);
      for (auto& v : x) v += shift;
      std::vector<int64_t> ref_arg;
      auto ref = ref_max(s, d2l::test::to_double(x), &ref_arg);
      d2l::test::for_thread_counts([&](const Ctx& c) {
        CAPTURE(c.threads);
        auto m = max_forward(c, s, x);
        CHECK(close(ref, m.y, 0, 0, "y"));  // a max is exact
        CHECK(close(ref_arg, m.arg, 0, 0, "argmax"));
      });
    }
  }
}

TEST_CASE("max_pool2d forward propagates NaN") {
  const Pool2dShape s{1, 1, 4, 4, 2, 2, 2, 2, 0, 0};
  auto x = lcg_data(16, 2);
  x[5] = NAN;  // row 1, column 1: in window (0, 0)
  auto m = max_forward(d2l::kernels::cpu::serial_ctx(), s, x);
  CHECK(std::isnan(m.y[0]));
  CHECK(m.arg[0] == 5);
  CHECK(!std::isnan(m.y[1]));
}

// Max pooling is piecewise linear: away from ties the central difference is exact up to double
// rounding. Tolerance atol 1e-5, rtol 1e-5 (dx sums a few float dy). h = 1e-3; points within 3h of
// a tie are skipped.
TEST_CASE("max_pool2d backward matches finite differences") {
  const double h = 1e-3;
  for (const auto& s : kShapes) {
    INFO(describe(s));
    auto x = lcg_data(x_size(s), 3), r = lcg_data(y_size(s), 4);
    auto skip = near_ties(s, x, 3 * h);
    auto fd = d2l::test::fd_gradient(
        x, [&](const auto& v) { return d2l::test::dot(ref_max(s, v), r); }, h, 400,
        [&](int64_t i) { return bool(skip[i]); });
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      auto m = max_forward(c, s, x);
      CHECK(d2l::test::fd_agrees(fd, max_backward(c, s, r, m.arg), 1e-5, 1e-5, "dx"));
    });
  }
}

TEST_CASE("avg_pool2d forward matches direct loops") {
  for (const auto& s : kShapes) {
    INFO(describe(s));
    auto x = lcg_data(x_size(s), 5);
    auto ref = ref_avg(s, d2l::test::to_double(x));
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      std::vector<float> y(y_size(s), -7.0f);
      d2l::kernels::cpu::avg_pool2d_forward(c, s, x.data(), y.data());
      CHECK(close(ref, y, 1e-6, 1e-5, "y"));
    });
  }
}

// Average pooling is linear: central differences exact up to rounding. atol 1e-6, rtol 1e-5.
TEST_CASE("avg_pool2d backward matches finite differences") {
  for (const auto& s : kShapes) {
    INFO(describe(s));
    auto x = lcg_data(x_size(s), 6), r = lcg_data(y_size(s), 7);
    auto fd = d2l::test::fd_gradient(
        x, [&](const auto& v) { return d2l::test::dot(ref_avg(s, v), r); }, 1e-2);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      CHECK(d2l::test::fd_agrees(fd, avg_backward(c, s, r), 1e-6, 1e-5, "dx"));
    });
  }
}

TEST_CASE("global_avg_pool forward and backward") {
  for (auto [N, C, HW] : std::vector<std::array<int64_t, 3>>{{1, 1, 1}, {1, 1, 35}, {3, 5, 13}, {2, 7, 49}}) {
    CAPTURE(N);
    CAPTURE(C);
    CAPTURE(HW);
    auto x = lcg_data(N * C * HW, 8), r = lcg_data(N * C, 9);
    auto ref = [&](const std::vector<double>& v) {  // y[p] = mean of plane p
      std::vector<double> y(N * C, 0.0);
      for (int64_t p = 0; p < N * C; ++p)
        for (int64_t i = 0; i < HW; ++i) y[p] += v[p * HW + i] / double(HW);
      return y;
    };
    auto fd = d2l::test::fd_gradient(
        x, [&](const auto& v) { return d2l::test::dot(ref(v), r); }, 1e-2);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      std::vector<float> y(N * C, -7.0f), dx(N * C * HW, -7.0f);
      d2l::kernels::cpu::global_avg_pool_forward(c, N, C, HW, x.data(), y.data());
      CHECK(close(ref(d2l::test::to_double(x)), y, 1e-6, 1e-5, "y"));
      d2l::kernels::cpu::global_avg_pool_backward(c, N, C, HW, r.data(), dx.data());
      CHECK(d2l::test::fd_agrees(fd, dx, 1e-6, 1e-5, "dx"));  // linear: exact up to rounding
    });
  }
}

TEST_CASE("pool2d finite-difference check rejects broken gradients") {
  const Pool2dShape s{2, 3, 13, 11, 3, 3, 2, 2, 1, 1};
  const double h = 1e-3;
  auto x = lcg_data(x_size(s), 3), r = lcg_data(y_size(s), 4);
  auto skip = near_ties(s, x, 3 * h);
  auto loss_max = [&](const std::vector<double>& v) { return d2l::test::dot(ref_max(s, v), r); };
  auto loss_avg = [&](const std::vector<double>& v) { return d2l::test::dot(ref_avg(s, v), r); };
  auto skip_fn = [&](int64_t i) { return bool(skip[i]); };
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto m = max_forward(c, s, x);
  REQUIRE(d2l::test::fd_check(x, max_backward(c, s, r, m.arg), loss_max, h, 1e-5, 1e-5, 400, skip_fn));

  auto shifted = m.arg;  // winner one column to the right (an off-by-one in the argmax bookkeeping)
  for (auto& a : shifted) a = (a + 1) % static_cast<int32_t>(s.H * s.W);
  CHECK_FALSE(d2l::test::fd_check(x, max_backward(c, s, r, shifted), loss_max, h, 1e-5, 1e-5, 400, skip_fn,
                                  "max dx shifted (expected)"));

  auto dx_avg = avg_backward(c, s, r);
  REQUIRE(d2l::test::fd_check(x, dx_avg, loss_avg, 1e-2, 1e-6, 1e-5));
  for (auto& v : dx_avg) v *= 1.05f;
  CHECK_FALSE(d2l::test::fd_check(x, dx_avg, loss_avg, 1e-2, 1e-6, 1e-5, 400, {}, "avg dx*1.05 (expected)"));
}

// ---- the emulated CUDA kernels against the CPU's
namespace {
namespace cpu = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
using namespace d2l::test;  // check.hpp, emu_check.hpp, fd_check.hpp

// {N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w}
const Pool2dShape kPoolShapes[] = {
    {1, 1, 7, 5, 3, 3, 2, 2, 1, 1},    // ResNet's 3x3/2 pad 1 max pool, batch 1, one channel
    {2, 3, 13, 11, 3, 3, 2, 2, 1, 1},  // the same on more planes
    {1, 1, 7, 5, 2, 2, 2, 2, 0, 0},    // LeNet's 2x2/2 on odd sizes: the last row/column dropped
    {2, 2, 13, 11, 3, 3, 2, 2, 0, 0},  // overlapping 3x3/2
    {2, 3, 9, 8, 3, 3, 1, 1, 1, 1},    // stride 1: every input in up to 9 windows
    {3, 2, 11, 7, 3, 2, 2, 1, 1, 0},   // non-square kernel and stride
    {2, 2, 10, 9, 5, 5, 3, 3, 2, 2},   // 5x5/3 pad 2
    {1, 4, 6, 5, 6, 5, 1, 1, 0, 0},    // window = whole image
    {5, 1, 8, 7, 1, 1, 1, 1, 0, 0},    // 1x1: identity
};
void check_pool(kemu::Stream st) {
  for (const Pool2dShape& s : kPoolShapes) {
    INFO("pool N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " k" << s.KH << "x" << s.KW << " s"
                  << s.stride_h << "," << s.stride_w << " p" << s.pad_h << "," << s.pad_w);
    auto x = lcg_data(x_size(s), 50);
    for (size_t i = 0; i < x.size(); i += 5) x[i] = x[i / 5 % x.size()];  // some repeated values: ties
    if (x.size() > 3) x[3] = NAN;                                          // a NaN wins its windows
    const auto dy = lcg_data(y_size(s), 51);
    std::vector<float> y(y_size(s), -7.0f), y_ref(y);
    std::vector<int32_t> arg(y_size(s), -7), arg_ref(arg);
    kemu::max_pool2d_forward(st, s, x.data(), y.data(), arg.data());
    cpu::max_pool2d_forward(cpu::serial_ctx(), s, x.data(), y_ref.data(), arg_ref.data());
    CHECK(same_bits(y_ref, y, "max_pool2d_forward y"));
    CHECK(arg == arg_ref);
    std::vector<float> dx(x_size(s), -7.0f), dx_ref(dx);
    kemu::max_pool2d_backward(st, s, dy.data(), arg_ref.data(), dx.data());
    cpu::max_pool2d_backward(cpu::serial_ctx(), s, dy.data(), arg_ref.data(), dx_ref.data());
    CHECK(close(dx_ref, dx, 1e-6, 1e-5, "max_pool2d_backward"));

    x[3] = 0.25f;
    kemu::avg_pool2d_forward(st, s, x.data(), y.data());
    cpu::avg_pool2d_forward(cpu::serial_ctx(), s, x.data(), y_ref.data());
    CHECK(close(y_ref, y, 1e-6, 1e-5, "avg_pool2d_forward"));
    kemu::avg_pool2d_backward(st, s, dy.data(), dx.data());
    cpu::avg_pool2d_backward(cpu::serial_ctx(), s, dy.data(), dx_ref.data());
    CHECK(close(dx_ref, dx, 1e-6, 1e-5, "avg_pool2d_backward"));
  }
  // Global average pooling, x (N, C, HW): planes shorter and longer than a warp.
  struct G {
    int64_t N, C, HW;
  };
  for (const G& g : {G{1, 1, 1}, G{2, 3, 49}, G{4, 5, 1000}, G{1, 2, 4099}, G{7, 1, 31}}) {
    const auto x = lcg_data(g.N * g.C * g.HW, 52), dy = lcg_data(g.N * g.C, 53);
    std::vector<float> y(g.N * g.C, NAN), y_ref(y), dx(g.N * g.C * g.HW, NAN), dx_ref(dx);
    kemu::global_avg_pool_forward(st, g.N, g.C, g.HW, x.data(), y.data());
    cpu::global_avg_pool_forward(cpu::serial_ctx(), g.N, g.C, g.HW, x.data(), y_ref.data());
    CHECK(close(y_ref, y, 1e-6, 1e-6, "global_avg_pool_forward"));
    kemu::global_avg_pool_backward(st, g.N, g.C, g.HW, dy.data(), dx.data());
    cpu::global_avg_pool_backward(cpu::serial_ctx(), g.N, g.C, g.HW, dy.data(), dx_ref.data());
    CHECK(same_bits(dx_ref, dx, "global_avg_pool_backward"));
  }
}

}  // namespace

D2L_EMULATED_CASES("emulated max, avg and global avg pooling match the CPU",
                   "emulated max, avg and global avg pooling on 2 device threads", check_pool)

// Values 0.01 apart in random order: a step of h = 1e-3 never changes which value wins a window.
static std::vector<float> distinct_values(int64_t n, uint32_t seed) {
  const auto key = lcg_data(n, seed);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) x[order[k]] = 0.01f * static_cast<float>(k - n / 2);
  return x;
}

TEST_CASE("emulated pooling backward passes match finite differences") {
  const Pool2dShape shapes[] = {{1, 1, 7, 5, 3, 3, 2, 2, 1, 1}, {2, 2, 7, 6, 3, 3, 1, 1, 1, 1}, {1, 2, 9, 8, 2, 2, 2, 2, 0, 0}};
  for (const Pool2dShape& s : shapes) {
    const auto x = distinct_values(x_size(s), 80), r = lcg_data(y_size(s), 81);
    auto max_y = [&](const std::vector<float>& xf, std::vector<int32_t>* arg) {
      std::vector<float> y(y_size(s));
      std::vector<int32_t> a(y_size(s));
      kemu::max_pool2d_forward(nullptr, s, xf.data(), y.data(), a.data());
      if (arg) *arg = a;
      return y;
    };
    std::vector<int32_t> arg;
    max_y(x, &arg);
    std::vector<float> dx(x_size(s));
    kemu::max_pool2d_backward(nullptr, s, r.data(), arg.data(), dx.data());
    auto loss_max = [&](const std::vector<double>& xd) { return dot(to_double(max_y(to_float(xd), nullptr)), r); };
    CHECK(grad_check(x, dx, loss_max, {1e-3}, "max_pool2d dx"));

    kemu::avg_pool2d_backward(nullptr, s, r.data(), dx.data());
    auto loss_avg = [&](const std::vector<double>& xd) {
      const auto xf = to_float(xd);
      std::vector<float> y(y_size(s));
      kemu::avg_pool2d_forward(nullptr, s, xf.data(), y.data());
      return dot(to_double(y), r);
    };
    CHECK(grad_check(x, dx, loss_avg, {5e-2}, "avg_pool2d dx"));
  }
  const int64_t N = 2, C = 3, HW = 5;
  const auto x = lcg_data(N * C * HW, 82), r = lcg_data(N * C, 83);
  std::vector<float> dx(N * C * HW);
  kemu::global_avg_pool_backward(nullptr, N, C, HW, r.data(), dx.data());
  auto loss = [&](const std::vector<double>& xd) {
    const auto xf = to_float(xd);
    std::vector<float> y(N * C);
    kemu::global_avg_pool_forward(nullptr, N, C, HW, xf.data(), y.data());
    return dot(to_double(y), r);
  };
  CHECK(grad_check(x, dx, loss, {5e-2}, "global_avg_pool dx"));
}
