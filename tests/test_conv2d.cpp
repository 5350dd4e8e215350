// The conv2d family (kernel1 direct loops, kernel2 im2col + GEMM, kernel3 Winograd, kernel4 blocked)
// against a six-loop convolution in double written here, and their backward passes against central
// finite differences of that reference; every member against kernel1; 1, 2 and 3 threads. At the end, the GPU's kernel3
// (kernels/cuda/conv2d_winograd.cu, emulated) against kernel1 on the CPU, and the GPU's choice.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"
#include "emu_check.hpp"

using d2l::kernels::cpu::Conv2dKernel;
using d2l::kernels::cpu::Conv2dShape;
using d2l::kernels::cpu::Ctx;
using d2l::test::close;
using d2l::test::launches;
using d2l::test::lcg_data;

namespace {

int64_t x_size(const Conv2dShape& s) { return s.N * s.C * s.H * s.W; }
int64_t w_size(const Conv2dShape& s) { return s.OC * s.C * s.KH * s.KW; }
int64_t y_size(const Conv2dShape& s) { return s.N * s.OC * s.OH() * s.OW(); }

// The three passes in double, and for each output the sum of |a||b| over its products (the scale of
// its rounding errors): y, dx, dw of x, w, r (r standing for dy; without r, y alone).
//   y[n][oc][oh][ow] = sum over ci, kh, kw of x[n][ci][oh*sh - ph + kh][ow*sw - pw + kw] * w[oc][ci][kh][kw]
// dx and dw sum the products of r with w and with x over the same index pairs.
struct RefPasses {
  std::vector<double> y, dx, dw, y_abs, dx_abs, dw_abs;
};
template <class T>
RefPasses ref_passes(const Conv2dShape& s, const std::vector<T>& x, const std::vector<T>& w,
                     const std::vector<T>& r = {}) {
  const int64_t OH = s.OH(), OW = s.OW();
  RefPasses p;
  p.y.assign(size_t(y_size(s)), 0.0), p.y_abs = p.y;
  if (!r.empty()) {
    p.dx.assign(size_t(x_size(s)), 0.0), p.dx_abs = p.dx;
    p.dw.assign(size_t(w_size(s)), 0.0), p.dw_abs = p.dw;
  }
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t oc = 0; oc < s.OC; ++oc)
      for (int64_t oh = 0; oh < OH; ++oh)
        for (int64_t ow = 0; ow < OW; ++ow) {
          const size_t yi = size_t(((n * s.OC + oc) * OH + oh) * OW + ow);
          for (int64_t ci = 0; ci < s.C; ++ci)
            for (int64_t kh = 0; kh < s.KH; ++kh)
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
                if (ih < 0 || ih >= s.H || iw < 0 || iw >= s.W) continue;
                const size_t xi = size_t(((n * s.C + ci) * s.H + ih) * s.W + iw);
                const size_t wi = size_t(((oc * s.C + ci) * s.KH + kh) * s.KW + kw);
                const double xv = x[xi], wv = w[wi];
                p.y[yi] += xv * wv, p.y_abs[yi] += std::fabs(xv * wv);
                if (r.empty()) continue;
                const double rv = r[yi];
                p.dx[xi] += rv * wv, p.dx_abs[xi] += std::fabs(rv * wv);
                p.dw[wi] += rv * xv, p.dw_abs[wi] += std::fabs(rv * xv);
              }
        }
  return p;
}
template <class T>
std::vector<double> ref_conv(const Conv2dShape& s, const std::vector<T>& x, const std::vector<T>& w) {
  return ref_passes(s, x, w).y;
}

// {N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w}
const std::vector<Conv2dShape> kShapes = {
    {1, 1, 7, 5, 1, 3, 3, 1, 1, 0, 0},    // batch 1, one channel, 3x3
    {1, 1, 7, 5, 2, 3, 3, 1, 1, 1, 1},    // padding 1
    {2, 3, 13, 11, 4, 3, 5, 2, 2, 1, 2},  // non-square kernel, stride 2, pad (1, 2)
    {3, 5, 7, 5, 6, 1, 1, 1, 1, 0, 0},    // 1x1 stride 1 (no im2col)
    {2, 4, 9, 7, 3, 1, 1, 2, 2, 0, 0},    // 1x1 stride 2 (im2col)
    {2, 2, 9, 8, 3, 5, 5, 1, 1, 2, 2},    // 5x5 pad 2
    {2, 3, 15, 13, 4, 7, 7, 2, 2, 3, 3},  // ResNet stem: 7x7 stride 2 pad 3
    {5, 2, 6, 7, 3, 2, 3, 2, 1, 0, 1},    // more images than threads, stride (2, 1)
    {2, 2, 5, 4, 3, 5, 4, 1, 1, 0, 0},    // kernel covers the image: 1x1 output
    {3, 2, 4, 6, 2, 3, 3, 3, 3, 2, 1},    // stride 3, output size rounds down
    {4, 3, 8, 8, 5, 3, 3, 1, 1, 1, 1},    // "same" 3x3
    // 3x3 stride 1 (kernel3's shapes): sizes that are no multiple of its tiles, every padding
    {2, 5, 1, 1, 3, 3, 3, 1, 1, 1, 1},    // 1x1 image: one output, 8 of 9 taps in the padding
    {1, 3, 11, 9, 7, 3, 3, 1, 1, 0, 0},   // padding 0, odd sizes: 9x7 outputs
    {2, 7, 5, 6, 3, 3, 3, 1, 1, 2, 2},    // padding 2: 7x8 outputs
    {1, 2, 3, 4, 2, 3, 3, 1, 1, 3, 1},    // padding (3, 1): backward_data cannot use kernel3
    {2, 13, 7, 10, 5, 3, 3, 1, 1, 1, 0},  // 13 channels, padding (1, 0)
};

std::string describe(const Conv2dShape& s) {
  char b[160];
  std::snprintf(b, sizeof b, "N%lld C%lld %lldx%lld OC%lld k%lldx%lld s%lld,%lld p%lld,%lld", (long long)s.N,
                (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.OC, (long long)s.KH,
                (long long)s.KW, (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h,
                (long long)s.pad_w);
  return b;
}

double rms(const std::vector<double>& v) {
  double s = 0;
  for (double e : v) s += e * e;
  return v.empty() ? 0.0 : std::sqrt(s / double(v.size()));
}

// How far a member's outputs may be from the double reference, as a fraction of the reference's root
// mean square: measured on the networks' shapes (the test case at the end of the file).
constexpr double kKernel1Tol = 5e-5;
double tolerance(Conv2dKernel m) {
  return m == Conv2dKernel::winograd ? 2e-4 : m == Conv2dKernel::blocked ? kKernel1Tol : 1e-5;
}

namespace k = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
const std::vector<Conv2dKernel> kMembers = {Conv2dKernel::direct, Conv2dKernel::im2col, Conv2dKernel::winograd,
                                            Conv2dKernel::winograd2, Conv2dKernel::blocked};

// Each member's name (in the messages) and its three passes (forward, backward_data, backward_weight)
// on the CPU (k::) and on the GPU (kemu::, emulated). A member a device does not have runs kernel2
// (im2col) there, as automatic's row does (the cases ask conv2d_auto_kernel which member automatic
// is); kernel3's backward_weight is kernel2's.
template <class Pass>
struct Passes {
  Pass forward, data, weight;
};
struct Member {
  Conv2dKernel m;
  const char* name;
  Passes<decltype(&k::conv2d_forward_direct)> cpu;
  Passes<decltype(&kemu::conv2d_forward_direct)> gpu;
};
// ns's conv2d_forward_<f>, conv2d_backward_data_<d> and conv2d_backward_weight_<w>.
#define PASSES(ns, f, d, w) {ns::conv2d_forward_##f, ns::conv2d_backward_data_##d, ns::conv2d_backward_weight_##w}
using K = Conv2dKernel;
const Member kMemberTable[] = {
    {K::direct, "kernel1 direct", PASSES(k, direct, direct, direct), PASSES(kemu, direct, direct, direct)},
    {K::im2col, "kernel2 im2col", PASSES(k, im2col, im2col, im2col), PASSES(kemu, im2col, im2col, im2col)},
    {K::winograd, "kernel3 winograd F(4x4,3x3)", PASSES(k, winograd, winograd, im2col), PASSES(kemu, winograd, winograd, im2col)},
    {K::winograd2, "kernel3 winograd2 F(2x2,3x3)", PASSES(k, winograd2, winograd2, im2col), PASSES(kemu, winograd2, winograd2, im2col)},
    {K::blocked, "kernel4 blocked", PASSES(k, blocked, blocked, blocked), PASSES(kemu, im2col, im2col, im2col)},
    {K::implicit, "kernel5 implicit GEMM", PASSES(k, im2col, im2col, im2col), PASSES(kemu, implicit, implicit, implicit)},
    {K::automatic, "automatic", PASSES(k, im2col, im2col, im2col), PASSES(kemu, im2col, im2col, im2col)},
};
#undef PASSES

const Member& member(Conv2dKernel m) {
  const Member* row =
      std::find_if(std::begin(kMemberTable), std::end(kMemberTable), [&](const Member& r) { return r.m == m; });
  REQUIRE(row != std::end(kMemberTable));
  return *row;
}
const char* name(Conv2dKernel m) { return member(m).name; }

// One pass of a member on the CPU (where: its Ctx) or on the emulated GPU (where: its stream): the output
// of `size` elements, filled with garbage first, so that the pass must write every one.
template <class Pass, class Where>
std::vector<float> run_pass(Pass pass, const Where& where, const Conv2dShape& s, int64_t size,
                            const std::vector<float>& a, const std::vector<float>& b) {
  std::vector<float> out(static_cast<size_t>(size), -7.0f);
  pass(where, s, a.data(), b.data(), out.data());
  return out;
}
std::vector<float> forward(const Ctx& c, const Conv2dShape& s, const std::vector<float>& x,
                           const std::vector<float>& w, Conv2dKernel m = Conv2dKernel::im2col) {
  return run_pass(member(m).cpu.forward, c, s, y_size(s), x, w);
}
std::vector<float> grad_x(const Ctx& c, const Conv2dShape& s, const std::vector<float>& dy,
                          const std::vector<float>& w, Conv2dKernel m = Conv2dKernel::im2col) {
  return run_pass(member(m).cpu.data, c, s, x_size(s), dy, w);
}
std::vector<float> grad_w(const Ctx& c, const Conv2dShape& s, const std::vector<float>& x,
                          const std::vector<float>& dy, Conv2dKernel m = Conv2dKernel::im2col) {
  return run_pass(member(m).cpu.weight, c, s, w_size(s), x, dy);
}
std::vector<float> gpu_forward(kemu::Stream st, const Conv2dShape& s, const std::vector<float>& x,
                               const std::vector<float>& w, Conv2dKernel m) {
  return run_pass(member(m).gpu.forward, st, s, y_size(s), x, w);
}
std::vector<float> gpu_grad_x(kemu::Stream st, const Conv2dShape& s, const std::vector<float>& dy,
                              const std::vector<float>& w, Conv2dKernel m) {
  return run_pass(member(m).gpu.data, st, s, x_size(s), dy, w);
}
std::vector<float> gpu_grad_w(kemu::Stream st, const Conv2dShape& s, const std::vector<float>& x,
                              const std::vector<float>& dy, Conv2dKernel m) {
  return run_pass(member(m).gpu.weight, st, s, w_size(s), x, dy);
}

}  // namespace

TEST_CASE("conv2d forward of every member matches the double reference") {
  for (Conv2dKernel m : kMembers)
    for (const auto& s : kShapes) {
      INFO(name(m) << ": " << describe(s));
      auto x = lcg_data(x_size(s), 1), w = lcg_data(w_size(s), 2);
      auto ref = ref_conv(s, d2l::test::to_double(x), d2l::test::to_double(w));
      d2l::test::for_thread_counts([&](const Ctx& c) {
        CAPTURE(c.threads);
        // float accumulation of at most 147 products of values in [-1, 1); F(4x4, 3x3) rounds more
        const double atol = m == Conv2dKernel::winograd ? tolerance(m) * rms(ref) : 1e-5;
        CHECK(close(ref, forward(c, s, x, w, m), atol, 1e-4, "y"));
      });
    }
}

// The tuned members against the reference member, all in float: the same sums in another order (and,
// for kernel3, through the Winograd transforms).
TEST_CASE("conv2d kernel2 (im2col), kernel3 (winograd) and kernel4 (blocked) match kernel1 (direct), forward and backward") {
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  for (Conv2dKernel m : kMembers)
    for (const auto& s : kShapes) {
      INFO(name(m) << ": " << describe(s));
      auto x = lcg_data(x_size(s), 8), w = lcg_data(w_size(s), 9), r = lcg_data(y_size(s), 10);
      const auto as_double = [](const std::vector<float>& v) { return d2l::test::to_double(v); };
      const auto y1 = as_double(forward(c, s, x, w, Conv2dKernel::direct));
      const auto dx1 = as_double(grad_x(c, s, r, w, Conv2dKernel::direct));
      const bool f4 = m == Conv2dKernel::winograd;  // F(4x4, 3x3) rounds more: its bound, on the outputs' size
      CHECK(close(y1, forward(c, s, x, w, m), f4 ? tolerance(m) * rms(y1) : 1e-5, 1e-4, "y"));
      CHECK(close(dx1, grad_x(c, s, r, w, m), f4 ? tolerance(m) * rms(dx1) : 1e-5, 1e-4, "dx"));
      CHECK(close(as_double(grad_w(c, s, x, r, Conv2dKernel::direct)), grad_w(c, s, x, r, m), 1e-4, 1e-4, "dw"));
    }
}

// conv2d_forward and the backward passes run the member set_conv2d_kernel chose, and only that one.
TEST_CASE("set_conv2d_kernel chooses the member conv2d_forward runs") {
  const Conv2dShape s{2, 3, 13, 11, 4, 3, 5, 2, 2, 1, 2};
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto x = lcg_data(x_size(s), 1), w = lcg_data(w_size(s), 2), r = lcg_data(y_size(s), 3);
  REQUIRE(k::conv2d_kernel() == Conv2dKernel::automatic);  // the default
  std::vector<Conv2dKernel> members = kMembers;
  members.push_back(Conv2dKernel::automatic);
  for (Conv2dKernel chosen : members) {
    INFO(name(chosen));
    k::set_conv2d_kernel(chosen);
    const Conv2dKernel m = chosen == Conv2dKernel::automatic ? k::conv2d_auto_kernel(s) : chosen;
    std::vector<float> y(static_cast<size_t>(y_size(s))), dx(static_cast<size_t>(x_size(s))), dw(static_cast<size_t>(w_size(s)));
    k::conv2d_forward(c, s, x.data(), w.data(), y.data());
    k::conv2d_backward_data(c, s, r.data(), w.data(), dx.data());
    k::conv2d_backward_weight(c, s, x.data(), r.data(), dw.data());
    CHECK(y == forward(c, s, x, w, m));  // bitwise: the same member ran
    CHECK(dx == grad_x(c, s, r, w, m));
    CHECK(dw == grad_w(c, s, x, r, m));
  }
  k::set_conv2d_kernel(Conv2dKernel::automatic);
}

// automatic's choice, from a table: each row a shape of the chapters (or an edge of the rule), the
// vector widths of a machine (kernel4's: 4 portable, 8 AVX2, 16 AVX-512; OpenBLAS's kernel set: 4
// SSE/Prescott, 8 Haswell, 16 SkylakeX) and the member bench/conv2d_bench measured fastest there
// (bench/README.md). Every row runs on every machine: the widths are arguments.
TEST_CASE("conv2d automatic: the member of each (shape, kernel4 width, GEMM width) of the table") {
  const Conv2dShape resnet{32, 64, 28, 28, 64, 3, 3, 1, 1, 1, 1};      // ResNet-18 stage 1: 1568 tiles
  const Conv2dShape deep{32, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1};        // stage 4: 32 tiles, 512 channels
  const Conv2dShape lenet1{256, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0};      // one input channel
  const Conv2dShape lenet2{256, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0};     // 5x5
  const Conv2dShape down{32, 64, 28, 28, 128, 3, 3, 2, 2, 1, 1};       // stride 2
  const Conv2dShape pointwise{32, 64, 28, 28, 64, 1, 1, 1, 1, 0, 0};   // 1x1
  const Conv2dShape edge{4, 16, 13, 11, 24, 3, 3, 1, 1, 1, 1};         // 48 tiles for 24 channels
  const Conv2dShape few{1, 16, 8, 8, 64, 3, 3, 1, 1, 1, 1};            // 4 tiles for 64 channels
  struct Row {
    const char* what;
    Conv2dShape s;
    int blocked, gemm;
    K want;
  };
  const Row table[] = {
      // AVX-512 kernel4 beside an SSE GEMM: kernel4 on every shape.
      {"resnet", resnet, 16, 4, K::blocked}, {"deep", deep, 16, 4, K::blocked}, {"lenet1", lenet1, 16, 4, K::blocked},
      {"lenet2", lenet2, 16, 4, K::blocked}, {"down", down, 16, 4, K::blocked}, {"pointwise", pointwise, 16, 4, K::blocked},
      // AVX2 kernel4 beside an SSE GEMM: the same.
      {"resnet", resnet, 8, 4, K::blocked}, {"lenet1", lenet1, 8, 4, K::blocked},
      // AVX-512 kernel4 beside an AVX2 GEMM: only where C and OC fill its blocks of 16.
      {"resnet", resnet, 16, 8, K::blocked}, {"deep", deep, 16, 8, K::blocked}, {"down", down, 16, 8, K::blocked},
      {"lenet1", lenet1, 16, 8, K::im2col}, {"lenet2", lenet2, 16, 8, K::im2col}, {"edge", edge, 16, 8, K::winograd},
      // As wide as the GEMM (or narrower): Winograd with a tile per channel, im2col otherwise.
      {"resnet", resnet, 16, 16, K::winograd}, {"resnet", resnet, 8, 8, K::winograd}, {"resnet", resnet, 4, 4, K::winograd},
      {"resnet", resnet, 4, 16, K::winograd}, {"edge", edge, 16, 16, K::winograd}, {"edge", edge, 4, 4, K::winograd},
      {"deep", deep, 16, 16, K::im2col}, {"few", few, 8, 8, K::im2col}, {"lenet1", lenet1, 16, 16, K::im2col},
      {"lenet2", lenet2, 8, 8, K::im2col}, {"down", down, 16, 16, K::im2col}, {"pointwise", pointwise, 4, 4, K::im2col},
  };
  for (const Row& r : table) {
    CAPTURE(r.what);
    CAPTURE(r.blocked);
    CAPTURE(r.gemm);
    CHECK(std::string(name(k::conv2d_auto_kernel(r.s, r.blocked, r.gemm))) == name(r.want));
  }
  // This machine's automatic is the table's rule at its widths.
  const int blocked = k::vector_isa_floats(k::conv2d_blocked_isa()), gemm = k::gemm_vector_floats();
  CAPTURE(k::gemm_description());
  for (const Row& r : table) CHECK(k::conv2d_auto_kernel(r.s) == k::conv2d_auto_kernel(r.s, blocked, gemm));
}

// What automatic runs is then the very same code as the member it picked: bitwise equal.
TEST_CASE("conv2d automatic runs its member's code: bitwise equal to winograd where it picks winograd") {
  const Conv2dShape many{4, 16, 13, 11, 24, 3, 3, 1, 1, 1, 1};
  const k::VectorIsa best = k::conv2d_blocked_isa();
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto x = lcg_data(x_size(many), 1), w = lcg_data(w_size(many), 2), r = lcg_data(y_size(many), 3);
  k::set_conv2d_blocked_isa(k::VectorIsa::portable);  // kernel4 at 4 floats: never wider than the GEMM
  REQUIRE(k::conv2d_auto_kernel(many) == Conv2dKernel::winograd);
  k::set_conv2d_kernel(Conv2dKernel::automatic);
  std::vector<float> y(static_cast<size_t>(y_size(many))), dx(static_cast<size_t>(x_size(many)));
  k::conv2d_forward(c, many, x.data(), w.data(), y.data());
  k::conv2d_backward_data(c, many, r.data(), w.data(), dx.data());
  k::set_conv2d_blocked_isa(best);
  CHECK(y == forward(c, many, x, w, Conv2dKernel::winograd));
  CHECK(dx == grad_x(c, many, r, w, Conv2dKernel::winograd));
}

// Conv is linear in x and in w, so central differences are exact up to double rounding (~1e-12
// here); the tolerance (atol 1e-4, rtol 1e-4) covers the kernels' float accumulation.
TEST_CASE("conv2d backward_data and backward_weight of every member match finite differences") {
  for (const auto& s : kShapes) {
    auto x = lcg_data(x_size(s), 3), w = lcg_data(w_size(s), 4), r = lcg_data(y_size(s), 5);
    const auto xd = d2l::test::to_double(x), wd = d2l::test::to_double(w);
    auto fd_x = d2l::test::fd_gradient(
        x, [&](const auto& v) { return d2l::test::dot(ref_conv(s, v, wd), r); }, 1e-2);
    auto fd_w = d2l::test::fd_gradient(
        w, [&](const auto& v) { return d2l::test::dot(ref_conv(s, xd, v), r); }, 1e-2);
    for (Conv2dKernel m : kMembers) {
      INFO(name(m) << ": " << describe(s));
      d2l::test::for_thread_counts([&](const Ctx& c) {
        CAPTURE(c.threads);
        CHECK(d2l::test::fd_agrees(fd_x, grad_x(c, s, r, w, m), 1e-4, 1e-4, "dx"));
        CHECK(d2l::test::fd_agrees(fd_w, grad_w(c, s, x, r, m), 1e-4, 1e-4, "dw"));
      });
    }
  }
}

TEST_CASE("conv2d finite-difference check rejects a broken gradient") {
  const Conv2dShape s{2, 3, 13, 11, 4, 3, 5, 2, 2, 1, 2};
  auto x = lcg_data(x_size(s), 3), w = lcg_data(w_size(s), 4), r = lcg_data(y_size(s), 5);
  const auto xd = d2l::test::to_double(x), wd = d2l::test::to_double(w);
  auto loss_x = [&](const std::vector<double>& v) { return d2l::test::dot(ref_conv(s, v, wd), r); };
  auto loss_w = [&](const std::vector<double>& v) { return d2l::test::dot(ref_conv(s, xd, v), r); };
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto dx = grad_x(c, s, r, w), dw = grad_w(c, s, x, r);
  REQUIRE(d2l::test::fd_check(x, dx, loss_x, 1e-2, 1e-4, 1e-4));  // the real ones pass
  REQUIRE(d2l::test::fd_check(w, dw, loss_w, 1e-2, 1e-4, 1e-4));

  auto dx_scaled = dx;
  for (auto& v : dx_scaled) v *= 1.05f;
  CHECK_FALSE(d2l::test::fd_check(x, dx_scaled, loss_x, 1e-2, 1e-4, 1e-4, 400, {}, "dx*1.05 (expected)"));
  std::vector<float> dw_shifted(dw.size());  // off by one index (the bug a wrong stride makes)
  for (size_t i = 0; i < dw.size(); ++i) dw_shifted[i] = dw[(i + 1) % dw.size()];
  CHECK_FALSE(d2l::test::fd_check(w, dw_shifted, loss_w, 1e-2, 1e-4, 1e-4, 400, {}, "dw shifted (expected)"));
}

TEST_CASE("conv2d backward_weight does not depend on the thread count") {
  const Conv2dShape s{8, 3, 9, 7, 5, 3, 3, 1, 1, 1, 1};
  auto x = lcg_data(x_size(s), 6), r = lcg_data(y_size(s), 7);
  for (Conv2dKernel m : kMembers) {
    INFO(name(m));
    std::vector<std::vector<float>> dws;
    d2l::test::for_thread_counts([&](const Ctx& c) { dws.push_back(grad_w(c, s, x, r, m)); });
    for (size_t t = 1; t < dws.size(); ++t)
      CHECK(std::memcmp(dws[0].data(), dws[t].data(), dws[0].size() * sizeof(float)) == 0);
  }
}

TEST_CASE("im2col matches its definition and col2im is its adjoint") {
  for (const auto& s0 : kShapes) {
    Conv2dShape s = s0;
    s.N = 1;
    const int64_t rows = s.C * s.KH * s.KW, P = s.OH() * s.OW();
    auto x = lcg_data(x_size(s), 8), r = lcg_data(rows * P, 9);
    std::vector<float> col(static_cast<size_t>(rows * P), -7.0f);
    d2l::kernels::cpu::im2col(s, x.data(), col.data());
    std::vector<double> ref(col.size());
    for (int64_t ci = 0; ci < s.C; ++ci)
      for (int64_t kh = 0; kh < s.KH; ++kh)
        for (int64_t kw = 0; kw < s.KW; ++kw)
          for (int64_t oh = 0; oh < s.OH(); ++oh)
            for (int64_t ow = 0; ow < s.OW(); ++ow) {
              int64_t ih = oh * s.stride_h - s.pad_h + kh, iw = ow * s.stride_w - s.pad_w + kw;
              bool inside = ih >= 0 && ih < s.H && iw >= 0 && iw < s.W;
              ref[((ci * s.KH + kh) * s.KW + kw) * P + oh * s.OW() + ow] =
                  inside ? x[(ci * s.H + ih) * s.W + iw] : 0;
            }
    CHECK(close(ref, col, 0, 0, "col"));
    // <im2col(x), r> == <x, col2im(r)>
    std::vector<float> back(x.size(), 0.0f);
    d2l::kernels::cpu::col2im(s, r.data(), back.data());
    double lhs = 0, rhs = 0;
    for (size_t i = 0; i < col.size(); ++i) lhs += double(col[i]) * r[i];
    for (size_t i = 0; i < x.size(); ++i) rhs += double(x[i]) * back[i];
    CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
  }
}

// ---- The networks' shapes, at small batches and images (a few seconds in all).
namespace {

// The worst error, as a fraction of the reference's root mean square.
double worst_error(const std::vector<double>& ref, const std::vector<float>& got) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::fabs(ref[i] - got[i]));
  return worst / rms(ref);
}

// The named shapes of the cases below, in one table: each row tagged with the set of cases that runs it.
enum class Set { nets, gpu_winograd, gpu_implicit, gpu_tf32, gpu_strided };
struct NetShape {
  Set set;
  const char* name;
  Conv2dShape s;
};
// {N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w}
const std::vector<NetShape> kNamedShapes = {
    // nets: the networks' own convolutions, at small batches and images (every CPU member on them).
    {Set::nets, "LeNet/lab CNN conv1 1->20 3x3", {4, 1, 28, 28, 20, 3, 3, 1, 1, 0, 0}},
    {Set::nets, "LeNet/lab CNN conv2 20->50 5x5 (not kernel3's)", {2, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0}},
    {Set::nets, "d2l LeNet conv1 1->6 5x5 pad 2 (not kernel3's)", {2, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2}},
    {Set::nets, "ResNet-18 stem 1->64 3x3", {2, 1, 28, 28, 64, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-18 64->64 3x3", {2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-18 64->128 3x3 /2 (not kernel3's)", {1, 64, 14, 14, 128, 3, 3, 2, 2, 1, 1}},
    {Set::nets, "ResNet-18 128->128 3x3", {1, 128, 10, 10, 128, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-18 256->256 3x3", {1, 256, 7, 7, 256, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-18 512->512 3x3", {1, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-50 64->64 3x3", {1, 64, 11, 11, 64, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-50 128->128 3x3", {1, 128, 9, 9, 128, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-50 256->256 3x3", {1, 256, 6, 6, 256, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-50 512->512 3x3", {1, 512, 3, 3, 512, 3, 3, 1, 1, 1, 1}},
    {Set::nets, "ResNet-50 256->256 3x3 /2 (not kernel3's)", {1, 256, 7, 7, 256, 3, 3, 2, 2, 1, 1}},
    {Set::nets, "37->29 channels 3x3, 13x11", {2, 37, 13, 11, 29, 3, 3, 1, 1, 1, 1}},
    // gpu_winograd: LeNet- and ResNet-like 3x3 stride-1 convs, small enough for the emulation: every
    // padding kernel3 takes for both passes, odd sizes (tiles cut at the edge), channels no multiple of 4,
    // 1 and more images (GPU kernel3, and kernel5 with gpu_implicit).
    {Set::gpu_winograd, "LeNet-like 1->6, 28x28, pad 0", {3, 1, 28, 28, 6, 3, 3, 1, 1, 0, 0}},
    {Set::gpu_winograd, "LeNet-like 6->16, 13x13, pad 1", {2, 6, 13, 13, 16, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_winograd, "ResNet-like 64->64, 14x14, pad 1", {2, 64, 14, 14, 64, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_winograd, "ResNet-like 128->128, 7x7, pad 1", {1, 128, 7, 7, 128, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_winograd, "37->29 channels, 13x11, pad 2", {2, 37, 13, 11, 29, 3, 3, 1, 1, 2, 2}},
    {Set::gpu_winograd, "5->3 channels, 9x7, pad (0, 1)", {3, 5, 9, 7, 3, 3, 3, 1, 1, 0, 1}},
    {Set::gpu_winograd, "13->5 channels, 7x10, pad (2, 1)", {1, 13, 7, 10, 5, 3, 3, 1, 1, 2, 1}},
    {Set::gpu_winograd, "1x1 image, pad 1 (8 of 9 taps in the padding)", {2, 5, 1, 1, 3, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_winograd, "3x3 image, pad 0 (one output)", {1, 1, 3, 3, 1, 3, 3, 1, 1, 0, 0}},
    // gpu_implicit: what kernel3 does not take, for kernel5 (strides, 5x5, 1x1, wide padding, a batch
    // larger than a 64-row tile, the networks' layers, rectangular filters).
    {Set::gpu_implicit, "stride 2, 3x3, pad 1", {2, 3, 13, 11, 4, 3, 3, 2, 2, 1, 1}},
    {Set::gpu_implicit, "5x5, pad 2", {2, 2, 9, 8, 3, 5, 5, 1, 1, 2, 2}},
    {Set::gpu_implicit, "pad 3 (the backward's taps past the output)", {1, 2, 3, 4, 2, 3, 3, 1, 1, 3, 1}},
    {Set::gpu_implicit, "1x1, stride 2", {3, 16, 7, 7, 8, 1, 1, 2, 2, 0, 0}},
    {Set::gpu_implicit, "stride (2, 1), 3x2 filter", {2, 4, 9, 8, 5, 3, 2, 2, 1, 1, 0}},
    {Set::gpu_implicit, "ResNet-like 64->70 on 8x8, 5 images (320 rows: 5 row tiles)", {5, 64, 8, 8, 70, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_implicit, "LeNet/lab CNN conv2 20->50 5x5, pad 0", {2, 20, 13, 13, 50, 5, 5, 1, 1, 0, 0}},
    {Set::gpu_implicit, "d2l LeNet conv1 1->6 5x5, pad 2", {2, 1, 28, 28, 6, 5, 5, 1, 1, 2, 2}},
    {Set::gpu_implicit, "ResNet-18 stem 1->64 3x3, pad 1", {2, 1, 12, 12, 64, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_implicit, "ResNet-18 64->128 3x3 /2", {1, 64, 14, 14, 128, 3, 3, 2, 2, 1, 1}},
    {Set::gpu_implicit, "ResNet-18 shortcut 64->128 1x1 /2", {2, 64, 14, 14, 128, 1, 1, 2, 2, 0, 0}},
    {Set::gpu_implicit, "ResNet-18 512->512 3x3 on 4x4", {1, 512, 4, 4, 512, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_implicit, "ResNet-50 bottleneck 256->64 1x1", {1, 256, 7, 7, 64, 1, 1, 1, 1, 0, 0}},
    {Set::gpu_implicit, "ResNet-50 bottleneck 64->256 1x1", {1, 64, 7, 7, 256, 1, 1, 1, 1, 0, 0}},
    {Set::gpu_implicit, "ResNet-50 stem 3->64 7x7 /2, pad 3", {1, 3, 21, 19, 64, 7, 7, 2, 2, 3, 3}},
    {Set::gpu_implicit, "rectangular 2x5 filter, pad (0, 2), stride (1, 3)", {2, 6, 9, 17, 7, 2, 5, 1, 3, 0, 2}},
    // gpu_tf32: small enough for the tensor cores' emulation (each lane of a warp does the warp's whole
    // product), for kernel5's fp32 and tf32 variants.
    {Set::gpu_tf32, "LeNet-like 1->6 3x3, 12x12, pad 0", {2, 1, 12, 12, 6, 3, 3, 1, 1, 0, 0}},
    {Set::gpu_tf32, "lab CNN 6->16 5x5, 9x9, pad 2", {1, 6, 9, 9, 16, 5, 5, 1, 1, 2, 2}},
    {Set::gpu_tf32, "ResNet-like 16->24 3x3, 6x7, pad 1", {2, 16, 6, 7, 24, 3, 3, 1, 1, 1, 1}},
    {Set::gpu_tf32, "ResNet-like 16->32 3x3 /2, pad (1, 0)", {1, 16, 9, 8, 32, 3, 3, 2, 2, 1, 0}},
    {Set::gpu_tf32, "ResNet shortcut 24->40 1x1 /2", {2, 24, 7, 6, 40, 1, 1, 2, 2, 0, 0}},
    // gpu_strided: kernel5's strided backward_data (its classes of input positions).
    {Set::gpu_strided, "ResNet 3x3 /2, pad 1, 1 image", {1, 5, 8, 8, 6, 3, 3, 2, 2, 1, 1}},
    {Set::gpu_strided, "3x3 /2, pad 1, odd 9x7, 3 images", {3, 4, 9, 7, 5, 3, 3, 2, 2, 1, 1}},
    {Set::gpu_strided, "3x3 /2, pad 1, 4 images of 12x12 (144 rows a class: 3 row tiles)", {4, 3, 12, 12, 5, 3, 3, 2, 2, 1, 1}},
    {Set::gpu_strided, "downsample 1x1 /2, pad 0, odd 7x9 (three classes of zeros)", {2, 6, 7, 9, 4, 1, 1, 2, 2, 0, 0}},
    {Set::gpu_strided, "1x1 /2, pad 1 (the padding makes class (1, 1) the one with a tap)", {1, 3, 6, 5, 4, 1, 1, 2, 2, 1, 1}},
    {Set::gpu_strided, "stem 7x7 /2, pad 3, odd 11x13", {2, 3, 11, 13, 8, 7, 7, 2, 2, 3, 3}},
    {Set::gpu_strided, "stride 3, 3x3, pad 1", {2, 3, 10, 11, 4, 3, 3, 3, 3, 1, 1}},
    {Set::gpu_strided, "stride 3, 5x5, pad 2 (2 or 1 taps a class and axis)", {1, 2, 8, 8, 3, 5, 5, 3, 3, 2, 2}},
    {Set::gpu_strided, "2x2 filter, stride 3 (rows 2 mod 3 meet no tap)", {1, 2, 7, 8, 3, 2, 2, 3, 3, 0, 0}},
    {Set::gpu_strided, "strides (2, 3), 3x5, pad (1, 2)", {2, 4, 9, 10, 5, 3, 5, 2, 3, 1, 2}},
    {Set::gpu_strided, "strides (3, 1), pad (0, 1)", {1, 3, 8, 7, 4, 3, 3, 3, 1, 0, 1}},
    {Set::gpu_strided, "stride 2, pads (0, 1)", {2, 3, 8, 9, 4, 3, 3, 2, 2, 0, 1}},
    {Set::gpu_strided, "stride 2, pads (2, 0), 4x3 filter", {1, 3, 9, 8, 4, 4, 3, 2, 2, 2, 0}},
    {Set::gpu_strided, "1x1 image, 3x3 /2, pad 1 (classes without positions)", {2, 3, 1, 1, 4, 3, 3, 2, 2, 1, 1}},
};

// The rows of `sets`, in the table's order.
std::vector<NetShape> shapes_of(std::initializer_list<Set> sets) {
  std::vector<NetShape> out;
  for (const NetShape& ns : kNamedShapes)
    if (std::find(sets.begin(), sets.end(), ns.set) != sets.end()) out.push_back(ns);
  return out;
}

}  // namespace

// The worst error of each member over the shapes below, as a fraction of the reference's root mean
// square (measured, data in [-1, 1)), and the bound the test holds them to (about 5x that):
//   kernel2 im2col           1.3e-6   bound 1e-5   (OpenBLAS's blocked sums)
//   kernel3 winograd2 F(2,3) 1.9e-6   bound 1e-5   (its transforms add and halve: no growth)
//   kernel3 winograd  F(4,3) 4.2e-5   bound 2e-4   (B^T's entries up to 5, A^T's up to 8, G's 1/6 and
//                                                    1/24: terms ~100x the result cancel in float)
//   kernel1 direct           9.9e-6   bound 5e-5   (one float sum of up to 4608 products, in order)
// The bounds are far below what a wrong transform entry gives (errors of the size of the result).
TEST_CASE("conv2d members on the networks' shapes: double reference, kernel1, thread counts") {
  for (const NetShape& ns : shapes_of({Set::nets})) {
    const Conv2dShape& s = ns.s;
    auto x = lcg_data(x_size(s), 11), w = lcg_data(w_size(s), 12), r = lcg_data(y_size(s), 13);
    const RefPasses ref = ref_passes(s, x, w, r);
    const std::vector<double>& y_ref = ref.y;
    const std::vector<double>& dx_ref = ref.dx;
    const Ctx c1 = d2l::kernels::cpu::serial_ctx();
    const auto y1 = forward(c1, s, x, w, Conv2dKernel::direct), dx1 = grad_x(c1, s, r, w, Conv2dKernel::direct);
    for (Conv2dKernel m : kMembers) {
      if (m == Conv2dKernel::direct) continue;
      INFO(name(m) << ": " << ns.name << ": " << describe(s));
      std::vector<std::vector<float>> ys, dxs;  // 1, 2 and 3 threads (kernel2's code: 1 thread)
      const bool winograd = (m == Conv2dKernel::winograd || m == Conv2dKernel::winograd2) && k::conv2d_winograd_fits(s);
      const bool own_y = winograd || m == Conv2dKernel::blocked;  // the member's own code, not kernel2's
      const bool own_dx = m == Conv2dKernel::blocked ? k::conv2d_blocked_fits_backward_data(s) : winograd;
      d2l::test::for_thread_counts([&](const Ctx& c) {
        if (c.threads > 1 && !own_y) return;
        ys.push_back(forward(c, s, x, w, m));
        dxs.push_back(grad_x(c, s, r, w, m));
      });
      const double ey = worst_error(y_ref, ys[0]), edx = worst_error(dx_ref, dxs[0]);
      const double ey1 = worst_error(y_ref, y1), edx1 = worst_error(dx_ref, dx1);
      std::printf("  %-30s %-48s y %.2e dx %.2e (kernel1: %.2e %.2e)\n", name(m), ns.name, ey, edx, ey1, edx1);
      const double tol = tolerance(m);
      CHECK(ey <= tol);
      CHECK(edx <= tol);
      CHECK(ey1 <= kKernel1Tol);
      CHECK(edx1 <= kKernel1Tol);
      // against kernel1 in float: both errors may add up
      CHECK(close(d2l::test::to_double(y1), ys[0], (tol + kKernel1Tol) * rms(y_ref), 0, "y vs kernel1"));
      CHECK(close(d2l::test::to_double(dx1), dxs[0], (tol + kKernel1Tol) * rms(dx_ref), 0, "dx vs kernel1"));
      // kernel3 and kernel4 split their work by the shape alone: bitwise the same for 1, 2, 3 threads
      // (kernel2, and the others where they fall back to it, may differ in the last bit: gemm's row split)
      for (size_t t = 1; t < ys.size(); ++t) {
        CAPTURE(t + 1);
        CHECK(std::memcmp(ys[0].data(), ys[t].data(), ys[0].size() * sizeof(float)) == 0);
        if (own_dx) CHECK(std::memcmp(dxs[0].data(), dxs[t].data(), dxs[0].size() * sizeof(float)) == 0);
      }
    }
  }
}

// kernel4 compiles its loops once per ISA (conv2d_blocked.cpp) and runs the CPU's widest; each one this
// CPU can run, the portable build included, against kernel1 on every shape above and the networks'.
TEST_CASE("conv2d kernel4 (blocked): every vector width this CPU runs matches kernel1") {
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  const k::VectorIsa best = k::conv2d_blocked_isa();
  REQUIRE(k::vector_isas().back() == best);  // the widest the CPU has runs by default
  std::vector<Conv2dShape> shapes = kShapes;
  for (const NetShape& ns : shapes_of({Set::nets})) shapes.push_back(ns.s);
  for (k::VectorIsa isa : k::vector_isas()) {
    k::set_conv2d_blocked_isa(isa);
    std::printf("  kernel4 blocked: %s\n", k::vector_isa_name(isa));
    for (const auto& s : shapes) {
      INFO(k::vector_isa_name(isa) << ": " << describe(s));
      auto x = lcg_data(x_size(s), 21), w = lcg_data(w_size(s), 22), r = lcg_data(y_size(s), 23);
      const auto y1 = d2l::test::to_double(forward(c, s, x, w, Conv2dKernel::direct));
      const auto dx1 = d2l::test::to_double(grad_x(c, s, r, w, Conv2dKernel::direct));
      CHECK(close(y1, forward(c, s, x, w, Conv2dKernel::blocked), 2 * kKernel1Tol * rms(y1), 0, "y"));
      CHECK(close(dx1, grad_x(c, s, r, w, Conv2dKernel::blocked), 2 * kKernel1Tol * rms(dx1), 0, "dx"));
      const auto dw1 = d2l::test::to_double(grad_w(c, s, x, r, Conv2dKernel::direct));
      CHECK(close(dw1, grad_w(c, s, x, r, Conv2dKernel::blocked), 2 * kKernel1Tol * rms(dw1), 0, "dw"));
    }
  }
  k::set_conv2d_blocked_isa(best);
}

// ---- kernel3 on the GPU (kernels/cuda/conv2d_winograd.cu), emulated: g++ runs the CUDA kernels on
// the CPU (emu(i) devices), with the emulated tiled GEMM (set_conv2d_gemm's default). Each pass against
// kernel1 on the CPU (conv2d_*_direct), bounded as on the CPU: F(2x2, 3x3) 1e-5 and F(4x4, 3x3) 2e-4 of
// the outputs' root mean square; shapes it does not take run the GPU's kernel2 (im2col), bit for bit.
namespace {

// The worst difference, as a fraction of the root mean square of `ref` (kernel1's float result).
double worst_vs(const std::vector<float>& ref, const std::vector<float>& got) {
  return worst_error(d2l::test::to_double(ref), got);
}

}  // namespace

TEST_CASE("GPU kernel3 winograd (emulated) matches kernel1 on the CPU, forward and backward_data") {
  const Ctx c1 = d2l::kernels::cpu::serial_ctx();
  for (Conv2dKernel m : {Conv2dKernel::winograd2, Conv2dKernel::winograd}) {
    double worst_y = 0, worst_dx = 0;
    for (const NetShape& ns : shapes_of({Set::gpu_winograd})) {
      const Conv2dShape& s = ns.s;
      INFO(name(m) << ": " << ns.name << ": " << describe(s));
      REQUIRE(k::conv2d_winograd_fits(s));
      auto x = lcg_data(x_size(s), 21), w = lcg_data(w_size(s), 22), r = lcg_data(y_size(s), 23);
      const int64_t input_launches = launches("winograd_input_kernel");
      const double ey = worst_vs(forward(c1, s, x, w, Conv2dKernel::direct), gpu_forward(nullptr, s, x, w, m));
      const double edx = worst_vs(grad_x(c1, s, r, w, Conv2dKernel::direct), gpu_grad_x(nullptr, s, r, w, m));
      CHECK(launches("winograd_input_kernel") >= input_launches + 2);  // kernel3 ran, not a fallback
      std::printf("  GPU %-28s %-46s y %.2e dx %.2e\n", name(m), ns.name, ey, edx);
      CHECK(ey <= tolerance(m));
      CHECK(edx <= tolerance(m));
      worst_y = std::max(worst_y, ey), worst_dx = std::max(worst_dx, edx);
    }
    std::printf("  GPU %-28s worst: y %.2e dx %.2e (bound %.0e)\n", name(m), worst_y, worst_dx, tolerance(m));
  }
}

// The tiles in chunks (a workspace of a few tiles' V and M): the same results as one chunk, up to
// the GEMMs' rounding, and one input transform per chunk.
TEST_CASE("GPU kernel3 winograd (emulated) splits its tiles into chunks that fit the workspace") {
  const Conv2dShape s{3, 7, 10, 9, 5, 3, 3, 1, 1, 1, 1};  // F(4x4): 3 * 3 * 3 = 27 tiles; F(2x2): 3 * 5 * 5 = 75
  const Ctx c1 = d2l::kernels::cpu::serial_ctx();
  auto x = lcg_data(x_size(s), 24), w = lcg_data(w_size(s), 25), r = lcg_data(y_size(s), 26);
  const auto y1 = forward(c1, s, x, w, Conv2dKernel::direct), dx1 = grad_x(c1, s, r, w, Conv2dKernel::direct);
  const int64_t saved = kemu::conv2d_winograd_workspace();
  for (Conv2dKernel m : {Conv2dKernel::winograd2, Conv2dKernel::winograd}) {
    INFO(name(m));
    const int64_t T = m == Conv2dKernel::winograd ? 36 : 16, tiles = m == Conv2dKernel::winograd ? 27 : 75;
    const auto y_one = gpu_forward(nullptr, s, x, w, m);
    kemu::set_conv2d_winograd_workspace(T * (s.C + s.OC) * 4);  // 4 tiles a chunk
    const int64_t before = launches("winograd_input_kernel");
    const auto y = gpu_forward(nullptr, s, x, w, m);
    CHECK(launches("winograd_input_kernel") - before == (tiles + 3) / 4);
    const auto dx = gpu_grad_x(nullptr, s, r, w, m);  // its tiles are dx's: 4 chunks of 4 tiles
    kemu::set_conv2d_winograd_workspace(saved);
    CHECK(worst_vs(y_one, y) <= tolerance(m));
    CHECK(worst_vs(y1, y) <= tolerance(m));
    CHECK(worst_vs(dx1, dx) <= tolerance(m));
  }
}

// Shapes kernel3 does not take (stride 2, 5x5; backward_data with padding 3) run the GPU's kernel2:
// the same bits as im2col, close to kernel1, and no Winograd transform launched.
TEST_CASE("GPU kernel3 winograd (emulated) falls back to im2col where it does not fit") {
  const Ctx c1 = d2l::kernels::cpu::serial_ctx();
  const std::vector<Conv2dShape> shapes = {
      {2, 3, 13, 11, 4, 3, 3, 2, 2, 1, 1},  // stride 2
      {2, 2, 9, 8, 3, 5, 5, 1, 1, 2, 2},    // 5x5
      {1, 2, 3, 4, 2, 3, 3, 1, 1, 3, 1},    // padding 3: forward is kernel3's, backward_data is not
  };
  for (Conv2dKernel m : {Conv2dKernel::winograd2, Conv2dKernel::winograd})
    for (const auto& s : shapes) {
      INFO(name(m) << ": " << describe(s));
      auto x = lcg_data(x_size(s), 27), w = lcg_data(w_size(s), 28), r = lcg_data(y_size(s), 29);
      const bool forward_fits = k::conv2d_winograd_fits(s);
      int64_t before = launches("winograd_");
      const auto y = gpu_forward(nullptr, s, x, w, m);
      CHECK((launches("winograd_") > before) == forward_fits);
      if (!forward_fits) CHECK(y == gpu_forward(nullptr, s, x, w, Conv2dKernel::im2col));
      CHECK(worst_vs(forward(c1, s, x, w, Conv2dKernel::direct), y) <= tolerance(m));
      before = launches("winograd_");
      const auto dx = gpu_grad_x(nullptr, s, r, w, m);
      CHECK(launches("winograd_") == before);
      CHECK(dx == gpu_grad_x(nullptr, s, r, w, Conv2dKernel::im2col));
      CHECK(worst_vs(grad_x(c1, s, r, w, Conv2dKernel::direct), dx) <= 1e-5);
    }
}

// The GPU's conv2d_forward and backward passes run the member the CPU's set_conv2d_kernel chose
// (automatic in FP32 under the emulation: winograd forward and backward_data, here where it fits, and
// im2col's backward_weight, where a real GPU runs kernel5's; blocked, a CPU member: im2col), bit for
// bit that member's launcher.
TEST_CASE("GPU conv2d (emulated) runs the member set_conv2d_kernel chose") {
  const Conv2dShape s{2, 5, 9, 7, 6, 3, 3, 1, 1, 1, 1};
  auto x = lcg_data(x_size(s), 30), w = lcg_data(w_size(s), 31), r = lcg_data(y_size(s), 32);
  REQUIRE(k::conv2d_kernel() == Conv2dKernel::automatic);
  // The members give different bits here, so the checks below can tell them apart.
  CHECK(gpu_forward(nullptr, s, x, w, Conv2dKernel::winograd) != gpu_forward(nullptr, s, x, w, Conv2dKernel::im2col));
  CHECK(gpu_forward(nullptr, s, x, w, Conv2dKernel::winograd2) != gpu_forward(nullptr, s, x, w, Conv2dKernel::winograd));
  auto passes_of = [&](Conv2dKernel m) {
    return std::vector<std::vector<float>>{gpu_forward(nullptr, s, x, w, m), gpu_grad_x(nullptr, s, r, w, m),
                                           gpu_grad_w(nullptr, s, x, r, m)};
  };
  CHECK(passes_of(Conv2dKernel::implicit) != passes_of(Conv2dKernel::im2col));  // (kernel1's sums in kernel1's order:
                                                                               // told apart by its launches below)
  for (Conv2dKernel chosen : {Conv2dKernel::direct, Conv2dKernel::im2col, Conv2dKernel::winograd,
                              Conv2dKernel::winograd2, Conv2dKernel::blocked, Conv2dKernel::implicit,
                              Conv2dKernel::automatic}) {
    INFO(name(chosen));
    k::set_conv2d_kernel(chosen);
    const Conv2dKernel m = chosen == Conv2dKernel::automatic ? Conv2dKernel::winograd
                           : chosen == Conv2dKernel::blocked ? Conv2dKernel::im2col
                                                             : chosen;
    std::vector<float> y(static_cast<size_t>(y_size(s))), dx(static_cast<size_t>(x_size(s))),
        dw(static_cast<size_t>(w_size(s)));
    const int64_t implicit_before = launches("conv2d_implicit_gemm_kernel");
    kemu::conv2d_forward(nullptr, s, x.data(), w.data(), y.data());
    kemu::conv2d_backward_data(nullptr, s, r.data(), w.data(), dx.data());
    kemu::conv2d_backward_weight(nullptr, s, x.data(), r.data(), dw.data());
    CHECK(launches("conv2d_implicit_gemm_kernel") - implicit_before ==
          (chosen == Conv2dKernel::implicit ? 3 : 0));
    k::set_conv2d_kernel(Conv2dKernel::automatic);
    CHECK(y == gpu_forward(nullptr, s, x, w, m));
    CHECK(dx == gpu_grad_x(nullptr, s, r, w, m));
    CHECK(dw == gpu_grad_w(nullptr, s, x, r, m));
  }
}

// ---- kernel5 on the GPU (kernels/cuda/conv2d_implicit.cu: implicit GEMM, each pass one GEMM over the whole
// batch), emulated: the three passes against kernel1 on the CPU on every shape kernel3 takes and on
// those it does not (strides, 5x5, 1x1, wide padding, a batch larger than a 64-row tile, the LeNet,
// lab-CNN, ResNet-18 and ResNet-50 layers, rectangular filters), within kernel1's own bound (5e-5 of
// the outputs' root mean square: both are float sums, of up to 4608 products, in different orders);
// each pass one launch of the GEMM, whatever the batch (plus the split-K sum where it splits).

TEST_CASE("GPU kernel5 implicit GEMM (emulated) matches kernel1 on the CPU, all three passes") {
  const Ctx c1 = d2l::kernels::cpu::serial_ctx();
  const std::vector<NetShape> shapes = shapes_of({Set::gpu_winograd, Set::gpu_implicit});
  double worst_y = 0, worst_dx = 0, worst_dw = 0;
  for (const NetShape& ns : shapes) {
    const Conv2dShape& s = ns.s;
    INFO(ns.name << ": " << describe(s));
    auto x = lcg_data(x_size(s), 41), w = lcg_data(w_size(s), 42), r = lcg_data(y_size(s), 43);
    std::vector<float> y(static_cast<size_t>(y_size(s)), -7.0f), dx(static_cast<size_t>(x_size(s)), -7.0f),
        dw(static_cast<size_t>(w_size(s)), -7.0f);  // garbage: every output must be written
    const int64_t before = launches("conv2d_implicit_gemm_kernel");
    kemu::conv2d_forward_implicit(nullptr, s, x.data(), w.data(), y.data());
    kemu::conv2d_backward_data_implicit(nullptr, s, r.data(), w.data(), dx.data());
    kemu::conv2d_backward_weight_implicit(nullptr, s, x.data(), r.data(), dw.data());
    CHECK(launches("conv2d_implicit_gemm_kernel") == before + 3);  // one GEMM a pass, no loop over images
    const double ey = worst_vs(forward(c1, s, x, w, Conv2dKernel::direct), y);
    const double edx = worst_vs(grad_x(c1, s, r, w, Conv2dKernel::direct), dx);
    const double edw = worst_vs(grad_w(c1, s, x, r, Conv2dKernel::direct), dw);
    CHECK(ey <= kKernel1Tol);
    CHECK(edx <= kKernel1Tol);
    CHECK(edw <= kKernel1Tol);
    worst_y = std::max(worst_y, ey), worst_dx = std::max(worst_dx, edx), worst_dw = std::max(worst_dw, edw);
  }
  std::printf("  GPU kernel5 implicit GEMM worst: y %.2e dx %.2e dw %.2e (bound %.0e)\n", worst_y, worst_dx, worst_dw,
              kKernel1Tol);
}

TEST_CASE("GPU kernel5 implicit GEMM (emulated) on 2 device threads: the same bits" * doctest::test_suite("threads")) {
  d2l::test::TwoThreads two;
  const Conv2dShape s{5, 13, 9, 8, 70, 3, 3, 1, 1, 1, 1};  // 360 rows, 70 columns: several blocks each way
  auto x = lcg_data(x_size(s), 44), w = lcg_data(w_size(s), 45), r = lcg_data(y_size(s), 46);
  auto run = [&](kemu::Stream st) {
    std::vector<float> y(static_cast<size_t>(y_size(s))), dx(static_cast<size_t>(x_size(s))), dw(static_cast<size_t>(w_size(s)));
    kemu::conv2d_forward_implicit(st, s, x.data(), w.data(), y.data());
    kemu::conv2d_backward_data_implicit(st, s, r.data(), w.data(), dx.data());
    kemu::conv2d_backward_weight_implicit(st, s, x.data(), r.data(), dw.data());
    return std::vector<std::vector<float>>{y, dx, dw};
  };
  CHECK(run(&two.ctx) == run(nullptr));
}

// ---- kernel5's variants and split-K (kernels/cuda/conv2d_implicit.cu), emulated.
namespace {

// The worst |got - ref| / (sum |a||b|) over the outputs (0 where an output has no products).
double worst_scaled(const std::vector<double>& ref, const std::vector<double>& abs_sum, const std::vector<float>& got) {
  double worst = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = std::fabs(ref[i] - got[i]);
    if (std::isnan(d)) return INFINITY;
    worst = std::max(worst, abs_sum[i] > 0 ? d / abs_sum[i] : d > 0 ? INFINITY : 0.0);
  }
  return worst;
}

// Sets the precision, kernel5's tile and its TF32 core for one scope, restoring all three after.
struct Kernel5Setting {
  d2l::kernels::cpu::Precision saved_precision = k::precision();
  int saved_tile = kemu::conv2d_implicit_tile();
  kemu::ImplicitCore saved_core = kemu::conv2d_implicit_core();
  Kernel5Setting(d2l::kernels::cpu::Precision p, int tile, kemu::ImplicitCore core = kemu::ImplicitCore::wmma) {
    k::set_precision(p);
    kemu::set_conv2d_implicit_tile(tile);
    kemu::set_conv2d_implicit_core(core);
  }
  ~Kernel5Setting() {
    k::set_precision(saved_precision);
    kemu::set_conv2d_implicit_tile(saved_tile);
    kemu::set_conv2d_implicit_core(saved_core);
  }
};

std::vector<std::vector<float>> implicit_passes(kemu::Stream st, const Conv2dShape& s, const std::vector<float>& x,
                                                const std::vector<float>& w, const std::vector<float>& r) {
  std::vector<float> y(size_t(y_size(s)), -7.0f), dx(size_t(x_size(s)), -7.0f), dw(size_t(w_size(s)), -7.0f);
  kemu::conv2d_forward_implicit(st, s, x.data(), w.data(), y.data());
  kemu::conv2d_backward_data_implicit(st, s, r.data(), w.data(), dx.data());
  kemu::conv2d_backward_weight_implicit(st, s, x.data(), r.data(), dw.data());
  return {y, dx, dw};
}

}  // namespace

// The fp32 variant with each tile (64x64 and 128x128) against the double reference: kernel1's bound.
TEST_CASE("GPU kernel5 fp32 (emulated): both tiles match the double reference, all three passes") {
  for (int tile : {64, 128}) {
    Kernel5Setting fp32(d2l::kernels::cpu::Precision::fp32, tile);
    for (const NetShape& ns : shapes_of({Set::gpu_tf32})) {
      const Conv2dShape& s = ns.s;
      INFO("tile " << tile << ": " << ns.name << ": " << describe(s));
      auto x = lcg_data(x_size(s), 51), w = lcg_data(w_size(s), 52), r = lcg_data(y_size(s), 53);
      const RefPasses ref = ref_passes(s, x, w, r);
      const int64_t before = launches("conv2d_implicit_gemm_kernel"), tf32_before = launches("conv2d_implicit_tf32_kernel");
      const auto got = implicit_passes(nullptr, s, x, w, r);
      CHECK(launches("conv2d_implicit_gemm_kernel") == before + 3);
      CHECK(launches("conv2d_implicit_tf32_kernel") == tf32_before);
      CHECK(worst_error(ref.y, got[0]) <= 1e-5);
      CHECK(worst_error(ref.dx, got[1]) <= 1e-5);
      CHECK(worst_error(ref.dw, got[2]) <= 1e-5);
    }
  }
}

// TF32: each product's inputs are rounded to 10 mantissa bits (relative error <= 2^-11 each, so <= about
// 2^-10 per product) and summed in FP32 (<= about K * 2^-24 relative to sum |a||b|). The bound per output:
//   |got - ref| <= (2^-10 + K * 2^-23) * sum over its products of |a||b|
// (twice the FP32 summation term for slack). That TF32 ran: the data (LCG floats, nearly all with bits
// below TF32's mantissa) gives results that differ from the fp32 variant's by far more than FP32 rounding
// (>= 1e-5 of the root mean square; FP32's own differences are ~1e-6), and the tf32 kernel was launched.
TEST_CASE("GPU kernel5 tf32 (emulated): within TF32's bound of the double reference, both tiles, all three passes") {
  for (int tile : {64, 128}) {
    for (const NetShape& ns : shapes_of({Set::gpu_tf32})) {
      const Conv2dShape& s = ns.s;
      INFO("tile " << tile << ": " << ns.name << ": " << describe(s));
      auto x = lcg_data(x_size(s), 54), w = lcg_data(w_size(s), 55), r = lcg_data(y_size(s), 56);
      const RefPasses ref = ref_passes(s, x, w, r);
      std::vector<std::vector<float>> fp32, tf32;
      {
        Kernel5Setting setting(d2l::kernels::cpu::Precision::fp32, tile);
        fp32 = implicit_passes(nullptr, s, x, w, r);
      }
      {
        Kernel5Setting setting(d2l::kernels::cpu::Precision::tf32, tile);
        const int64_t before = launches("conv2d_implicit_tf32_kernel");
        tf32 = implicit_passes(nullptr, s, x, w, r);
        CHECK(launches("conv2d_implicit_tf32_kernel") == before + 3);
      }
      const double K[3] = {double(s.C * s.KH * s.KW), double(s.OC * s.KH * s.KW), double(s.N * s.OH() * s.OW())};
      const std::vector<double>* refs[3] = {&ref.y, &ref.dx, &ref.dw};
      const std::vector<double>* abs_sums[3] = {&ref.y_abs, &ref.dx_abs, &ref.dw_abs};
      for (int pass = 0; pass < 3; ++pass) {
        INFO("pass " << pass << " (0 forward, 1 backward_data, 2 backward_weight)");
        const double bound = std::ldexp(1.0, -10) + K[pass] * std::ldexp(1.0, -23);
        CHECK(worst_scaled(*refs[pass], *abs_sums[pass], tf32[pass]) <= bound);
        CHECK(worst_error(*refs[pass], fp32[pass]) <= 1e-5);
        CHECK(worst_vs(fp32[pass], tf32[pass]) >= 1e-5);  // TF32 really ran
      }
    }
  }
}

// automatic is fp32 under the emulation (tf32 on real GPUs of sm_80 and later).
TEST_CASE("GPU kernel5 (emulated): precision automatic runs the fp32 variant") {
  REQUIRE(k::precision() == d2l::kernels::cpu::Precision::automatic);
  const Conv2dShape s{1, 3, 6, 5, 4, 3, 3, 1, 1, 1, 1};
  auto x = lcg_data(x_size(s), 57), w = lcg_data(w_size(s), 58), r = lcg_data(y_size(s), 59);
  const int64_t before = launches("conv2d_implicit_gemm_kernel"), tf32_before = launches("conv2d_implicit_tf32_kernel");
  const auto got = implicit_passes(nullptr, s, x, w, r);
  CHECK(launches("conv2d_implicit_gemm_kernel") == before + 3);
  CHECK(launches("conv2d_implicit_tf32_kernel") == tf32_before);
  Kernel5Setting fp32(d2l::kernels::cpu::Precision::fp32, 0);
  CHECK(implicit_passes(nullptr, s, x, w, r) == got);
}

// ---- kernel5's strided backward_data (BackwardDataStrided: the input positions grouped by (ih mod sh,
// iw mod sw), each group a dense GEMM over its own taps, all in one launch), emulated: against kernel1 on
// the CPU and the double reference in FP32, within TF32's bound in TF32. Odd sizes give classes of
// different sizes; some shapes leave classes without taps (their dx is 0) or without positions.
namespace {

std::vector<float> implicit_grad_x(kemu::Stream st, const Conv2dShape& s, const std::vector<float>& r,
                                   const std::vector<float>& w) {
  std::vector<float> dx(size_t(x_size(s)), -7.0f);  // garbage: every dx element must be written
  kemu::conv2d_backward_data_implicit(st, s, r.data(), w.data(), dx.data());
  return dx;
}

// The most products one dx element sums: OC times its class' taps, at most ceil(KH / sh) * ceil(KW / sw).
double strided_depth(const Conv2dShape& s) {
  return double(s.OC * ((s.KH + s.stride_h - 1) / s.stride_h) * ((s.KW + s.stride_w - 1) / s.stride_w));
}
}  // namespace

TEST_CASE("GPU kernel5 strided backward_data (emulated): fp32 matches kernel1 and the double reference, one launch") {
  const Ctx c1 = d2l::kernels::cpu::serial_ctx();
  for (int tile : {0, 128}) {
    Kernel5Setting fp32(d2l::kernels::cpu::Precision::fp32, tile);
    for (const NetShape& ns : shapes_of({Set::gpu_strided})) {
      const Conv2dShape& s = ns.s;
      INFO("tile " << tile << ": " << ns.name << ": " << describe(s));
      auto w = lcg_data(w_size(s), 71), r = lcg_data(y_size(s), 72);
      const RefPasses ref = ref_passes(s, lcg_data(x_size(s), 70), w, r);
      const int64_t before = launches("conv2d_implicit_gemm_kernel"), tf32_before = launches("conv2d_implicit_tf32_kernel");
      const auto dx = implicit_grad_x(nullptr, s, r, w);
      CHECK(launches("conv2d_implicit_gemm_kernel") == before + 1);  // every class in one launch
      CHECK(launches("conv2d_implicit_tf32_kernel") == tf32_before);
      CHECK(worst_vs(grad_x(c1, s, r, w, Conv2dKernel::direct), dx) <= kKernel1Tol);
      CHECK(worst_error(ref.dx, dx) <= 1e-5);
      CHECK(worst_scaled(ref.dx, ref.dx_abs, dx) <= strided_depth(s) * std::ldexp(1.0, -22));
    }
  }
}

TEST_CASE("GPU kernel5 strided backward_data (emulated): tf32 within TF32's bound of the double reference") {
  for (const NetShape& ns : shapes_of({Set::gpu_strided})) {
    const Conv2dShape& s = ns.s;
    INFO(ns.name << ": " << describe(s));
    auto w = lcg_data(w_size(s), 74), r = lcg_data(y_size(s), 75);
    const RefPasses ref = ref_passes(s, lcg_data(x_size(s), 73), w, r);
    std::vector<float> fp32, tf32;
    {
      Kernel5Setting setting(d2l::kernels::cpu::Precision::fp32, 0);
      fp32 = implicit_grad_x(nullptr, s, r, w);
    }
    {
      Kernel5Setting setting(d2l::kernels::cpu::Precision::tf32, 0);
      const int64_t before = launches("conv2d_implicit_tf32_kernel");
      tf32 = implicit_grad_x(nullptr, s, r, w);
      CHECK(launches("conv2d_implicit_tf32_kernel") == before + 1);
    }
    CHECK(worst_scaled(ref.dx, ref.dx_abs, tf32) <= std::ldexp(1.0, -10) + strided_depth(s) * std::ldexp(1.0, -23));
    CHECK(worst_vs(fp32, tf32) >= 1e-5);  // TF32 really ran
  }
}

// Split-K over the classes: each slice of the workspace holds every class' outputs (a class whose taps end
// before a slice's range gives that slice zeros), summed in slice order; the same bits on 1 or 2 threads.
TEST_CASE("GPU kernel5 strided backward_data (emulated): split-K and 2 device threads give the same bits" *
          doctest::test_suite("threads")) {
  d2l::test::TwoThreads two;
  const Conv2dShape s{2, 5, 9, 11, 40, 3, 3, 2, 2, 1, 1};  // Kdim 40 * 2 * 2 = 160: split in slices of 64
  auto w = lcg_data(w_size(s), 77), r = lcg_data(y_size(s), 78);
  const RefPasses ref = ref_passes(s, lcg_data(x_size(s), 76), w, r);
  for (auto p : {d2l::kernels::cpu::Precision::fp32, d2l::kernels::cpu::Precision::tf32}) {
    Kernel5Setting setting(p, 0);
    INFO("precision " << int(p));
    const int64_t before = launches("conv2d_implicit_splitk_sum_kernel");
    const auto dx = implicit_grad_x(nullptr, s, r, w);
    CHECK(launches("conv2d_implicit_splitk_sum_kernel") == before + 1);  // split, then summed
    CHECK(implicit_grad_x(&two.ctx, s, r, w) == dx);
    CHECK(worst_scaled(ref.dx, ref.dx_abs, dx) <= std::ldexp(1.0, -10) + strided_depth(s) * std::ldexp(1.0, -23));
  }
}

// backward_weight's GEMM (M = OC, Ncol = C*KH*KW: a few tiles; Kdim = N*OH*OW) is split along k into
// slices summed in a fixed order: the same bits on every run and on 1 or 2 device threads, both variants.
TEST_CASE("GPU kernel5 split-K backward_weight (emulated): the same bits on every run and thread count" *
          doctest::test_suite("threads")) {
  d2l::test::TwoThreads two;
  const Conv2dShape s{3, 8, 10, 9, 12, 3, 3, 1, 1, 1, 1};  // Kdim 270: 5 slices of 64 (fp32; tf32: 3 of 128)
  auto x = lcg_data(x_size(s), 60), r = lcg_data(y_size(s), 61);
  const RefPasses ref = ref_passes(s, x, lcg_data(w_size(s), 62), r);
  for (auto p : {d2l::kernels::cpu::Precision::fp32, d2l::kernels::cpu::Precision::tf32}) {
    Kernel5Setting setting(p, 0);
    INFO("precision " << int(p));
    auto run = [&](kemu::Stream st) {
      std::vector<float> dw(size_t(w_size(s)), -7.0f);
      kemu::conv2d_backward_weight_implicit(st, s, x.data(), r.data(), dw.data());
      return dw;
    };
    const int64_t before = launches("conv2d_implicit_splitk_sum_kernel");
    const auto dw = run(nullptr);
    CHECK(launches("conv2d_implicit_splitk_sum_kernel") == before + 1);  // split, then summed
    CHECK(run(nullptr) == dw);
    CHECK(run(&two.ctx) == dw);
    CHECK(worst_scaled(ref.dw, ref.dw_abs, dw) <= std::ldexp(1.0, -10) + 270 * std::ldexp(1.0, -23));
  }
}

// The mma core (mma.sync fed by cp.async pipelines) against the double reference within TF32's bound, with
// each of its tiles (128x64 forced by 64, 128x128 by 128) and the launcher's choice, strided backward_data's
// classes included. Under the emulation a copy's destination reads NaN until its group is waited for, so a
// slice computed on too early fails here; mma.sync takes its fragments in PTX's per-lane layout, so a
// fragment read from the wrong place is a wrong product. That the mma core ran: its kernel was launched, the
// others were not, and the results differ from the fp32 core's as TF32's do.
TEST_CASE("GPU kernel5 mma core (emulated): within TF32's bound of the double reference, every tile and pass") {
  std::vector<NetShape> shapes = shapes_of({Set::gpu_tf32});
  for (const NetShape& ns : shapes_of({Set::gpu_strided})) shapes.push_back(ns);
  for (int tile : {0, 64, 128}) {
    for (const NetShape& ns : shapes) {
      const Conv2dShape& s = ns.s;
      INFO("tile " << tile << ": " << ns.name << ": " << describe(s));
      auto x = lcg_data(x_size(s), 81), w = lcg_data(w_size(s), 82), r = lcg_data(y_size(s), 83);
      const RefPasses ref = ref_passes(s, x, w, r);
      std::vector<std::vector<float>> fp32, mma;
      {
        Kernel5Setting setting(d2l::kernels::cpu::Precision::fp32, tile, kemu::ImplicitCore::mma);
        fp32 = implicit_passes(nullptr, s, x, w, r);
      }
      {
        Kernel5Setting setting(d2l::kernels::cpu::Precision::tf32, tile, kemu::ImplicitCore::mma);
        const int64_t before = launches("conv2d_implicit_mma_kernel"), wmma = launches("conv2d_implicit_tf32_kernel"),
                      simt = launches("conv2d_implicit_gemm_kernel");
        mma = implicit_passes(nullptr, s, x, w, r);
        CHECK(launches("conv2d_implicit_mma_kernel") == before + 3);
        CHECK(launches("conv2d_implicit_tf32_kernel") == wmma);
        CHECK(launches("conv2d_implicit_gemm_kernel") == simt);
      }
      const double depth_dx = s.stride_h * s.stride_w > 1 ? strided_depth(s) : double(s.OC * s.KH * s.KW);
      const double K[3] = {double(s.C * s.KH * s.KW), depth_dx, double(s.N * s.OH() * s.OW())};
      const std::vector<double>* refs[3] = {&ref.y, &ref.dx, &ref.dw};
      const std::vector<double>* abs_sums[3] = {&ref.y_abs, &ref.dx_abs, &ref.dw_abs};
      for (int pass = 0; pass < 3; ++pass) {
        INFO("pass " << pass << " (0 forward, 1 backward_data, 2 backward_weight)");
        CHECK(worst_scaled(*refs[pass], *abs_sums[pass], mma[pass]) <= std::ldexp(1.0, -10) + K[pass] * std::ldexp(1.0, -23));
        CHECK(worst_vs(fp32[pass], mma[pass]) >= 1e-5);  // TF32 really ran
      }
    }
  }
}

// The mma core split along k (backward_weight's long Kdim, strided backward_data's classes): every slice of
// the workspace written whole, summed in slice order; the same bits on every run and on 1 or 2 device threads.
TEST_CASE("GPU kernel5 mma core split-K (emulated): the same bits on every run and thread count" *
          doctest::test_suite("threads")) {
  d2l::test::TwoThreads two;
  Kernel5Setting setting(d2l::kernels::cpu::Precision::tf32, 0, kemu::ImplicitCore::mma);
  for (const Conv2dShape& s : {Conv2dShape{3, 8, 10, 9, 12, 3, 3, 1, 1, 1, 1}, Conv2dShape{2, 5, 9, 11, 40, 3, 3, 2, 2, 1, 1}}) {
    INFO(describe(s));
    auto x = lcg_data(x_size(s), 84), w = lcg_data(w_size(s), 85), r = lcg_data(y_size(s), 86);
    const RefPasses ref = ref_passes(s, x, w, r);
    const int64_t before = launches("conv2d_implicit_splitk_sum_kernel");
    const auto got = implicit_passes(nullptr, s, x, w, r);
    CHECK(launches("conv2d_implicit_splitk_sum_kernel") > before);  // split, then summed
    CHECK(implicit_passes(nullptr, s, x, w, r) == got);
    CHECK(implicit_passes(&two.ctx, s, x, w, r) == got);
    CHECK(worst_scaled(ref.dw, ref.dw_abs, got[2]) <= std::ldexp(1.0, -10) + double(s.N * s.OH() * s.OW()) * std::ldexp(1.0, -23));
  }
}

// On an emulated device of two threads the blocks spread over both: the same bits (each output is
// written by one thread, in a fixed order).
TEST_CASE("GPU kernel3 winograd (emulated) on 2 device threads" * doctest::test_suite("threads")) {
  d2l::test::TwoThreads two;
  const Conv2dShape s{2, 37, 13, 11, 29, 3, 3, 1, 1, 1, 1};
  auto x = lcg_data(x_size(s), 33), w = lcg_data(w_size(s), 34), r = lcg_data(y_size(s), 35);
  for (Conv2dKernel m : {Conv2dKernel::winograd2, Conv2dKernel::winograd}) {
    INFO(name(m));
    CHECK(gpu_forward(&two.ctx, s, x, w, m) == gpu_forward(nullptr, s, x, w, m));
    CHECK(gpu_grad_x(&two.ctx, s, r, w, m) == gpu_grad_x(nullptr, s, r, w, m));
  }
}
