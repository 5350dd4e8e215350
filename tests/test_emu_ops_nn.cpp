// Emulated conv2d (im2col + tiled GEMM, the direct kernel and kernel5's implicit GEMM) against its kernels/cpu twin on odd
// shapes, and every emulated backward against central finite differences of the emulated forward (a
// gradient x1.05 must fail the same check). pool2d's and batch_norm's emulated kernels are checked by
// their own tests (tests/test_pool2d.cpp, tests/test_batch_norm.cpp).
// Tolerances (d2l::test::close: |ref - x| <= atol + rtol |ref|; data in [-1, 1)):
//   bitwise       im2col (copies)
//   1e-6/1e-5     float sums of a few terms whose order the CPU is free to change: col2im
//   conv2d        float sums of k products (tiled GEMM or direct loop vs OpenBLAS): atol 1e-5 (k + 1),
//                 rtol 1e-5 with k = C*KH*KW (forward), OC*KH*KW (data), N*OH*OW (weight); kernel5's
//                 tf32 variant, on its wmma and its mma core (TF32 inputs): atol 1e-3 (k + 1), rtol 1e-3
//   FD            atol 1e-3, rtol 1e-2 (FdTol, tests/emu_check.hpp); h 5e-2 (conv2d is linear in x and in w)
#include <string>
#include <vector>

#include "test_emu_ops.hpp"

using namespace emu_ops;
using Conv = cpu::Conv2dShape;

namespace {

// {N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w}
const Conv kConvShapes[] = {
    {1, 1, 7, 5, 1, 3, 3, 1, 1, 0, 0},     // batch 1, one channel, 3x3 valid
    {2, 3, 13, 11, 4, 3, 3, 2, 2, 1, 1},   // 3x3 stride 2 pad 1 (ResNet's downsampling conv)
    {1, 2, 7, 5, 3, 1, 1, 1, 1, 0, 0},     // 1x1 stride 1: pointwise, no im2col
    {3, 1, 7, 5, 2, 1, 1, 2, 2, 0, 0},     // 1x1 stride 2 (ResNet's shortcut): im2col needed
    {2, 2, 13, 11, 3, 5, 5, 1, 1, 2, 2},   // 5x5 pad 2 (LeNet's first layer keeps the size)
    {1, 3, 13, 11, 2, 5, 5, 2, 2, 0, 0},   // 5x5 stride 2 unpadded: the last row/column dropped
    {2, 4, 5, 7, 3, 3, 3, 1, 2, 1, 0},     // different stride and padding per axis
    {1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0},     // one pixel
    {1, 2, 7, 5, 17, 3, 3, 1, 1, 1, 1},    // OC 17: more than one 16-wide GEMM tile
};

std::string describe(const Conv& s) {
  char b[160];
  std::snprintf(b, sizeof b, "conv N%lld C%lld %lldx%lld OC%lld k%lldx%lld s%lld,%lld p%lld,%lld", (long long)s.N,
                (long long)s.C, (long long)s.H, (long long)s.W, (long long)s.OC, (long long)s.KH, (long long)s.KW,
                (long long)s.stride_h, (long long)s.stride_w, (long long)s.pad_h, (long long)s.pad_w);
  return b;
}
int64_t x_size(const Conv& s) { return s.N * s.C * s.H * s.W; }
int64_t w_size(const Conv& s) { return s.OC * s.C * s.KH * s.KW; }
int64_t y_size(const Conv& s) { return s.N * s.OC * s.OH() * s.OW(); }

void check_conv(kemu::Stream st) {
  for (const Conv& s : kConvShapes) {
    INFO(describe(s));
    const auto x = lcg_data(x_size(s), 40), w = lcg_data(w_size(s), 41), dy = lcg_data(y_size(s), 42);
    const int64_t K = s.C * s.KH * s.KW, P = s.OH() * s.OW();
    std::vector<float> y(y_size(s), NAN), y_ref(y_size(s), NAN), y_direct(y_size(s), NAN);
    kemu::conv2d_forward(st, s, x.data(), w.data(), y.data());
    cpu::conv2d_forward(kSerial, s, x.data(), w.data(), y_ref.data());
    CHECK(close(y_ref, y, 1e-5 * double(K + 1), 1e-5, "conv2d_forward"));
    kemu::conv2d_forward_direct(st, s, x.data(), w.data(), y_direct.data());
    CHECK(close(y_ref, y_direct, 1e-5 * double(K + 1), 1e-5, "conv2d_forward_direct"));
    std::vector<float> y_implicit(y_size(s), NAN);
    kemu::conv2d_forward_implicit(st, s, x.data(), w.data(), y_implicit.data());
    CHECK(close(y_ref, y_implicit, 1e-5 * double(K + 1), 1e-5, "conv2d_forward_implicit"));
    // Both backward passes of one member (kernel2, kernel1, then kernel5, whose CPU twin is kernel1's
    // loops), emulated against the CPU's member.
    auto check_backward = [&](auto emu_data, auto cpu_data, auto emu_weight, auto cpu_weight, const std::string& name) {
      std::vector<float> dx(x_size(s), NAN), dx_ref(x_size(s), NAN);  // garbage in: overwritten
      emu_data(st, s, dy.data(), w.data(), dx.data());
      cpu_data(kSerial, s, dy.data(), w.data(), dx_ref.data());
      CHECK(close(dx_ref, dx, 1e-5 * double(s.OC * s.KH * s.KW + 1), 1e-5, ("conv2d_backward_data" + name).c_str()));
      std::vector<float> dw(w_size(s), NAN), dw_ref(w_size(s), NAN);
      emu_weight(st, s, x.data(), dy.data(), dw.data());
      cpu_weight(kSerial, s, x.data(), dy.data(), dw_ref.data());
      CHECK(close(dw_ref, dw, 1e-5 * double(s.N * P + 1), 1e-5, ("conv2d_backward_weight" + name).c_str()));
    };
    check_backward(kemu::conv2d_backward_data, cpu::conv2d_backward_data, kemu::conv2d_backward_weight,
                   cpu::conv2d_backward_weight, "");
    check_backward(kemu::conv2d_backward_data_direct, cpu::conv2d_backward_data_direct,
                   kemu::conv2d_backward_weight_direct, cpu::conv2d_backward_weight_direct, "_direct");
    check_backward(kemu::conv2d_backward_data_implicit, cpu::conv2d_backward_data_direct,
                   kemu::conv2d_backward_weight_implicit, cpu::conv2d_backward_weight_direct, "_implicit");
    {  // kernel5's tf32 variant: TF32 inputs (13 bits fewer), FP32 sums: each output within about
       // 2^-10 sum |a||b| <= 2^-10 k of the CPU's, so atol 1e-3 (k + 1), rtol 1e-3
      // On either TF32 core: wmma (the default) and mma (mma.sync fed by cp.async).
      const cpu::Precision saved = cpu::precision();
      std::vector<float> dx_ref(x_size(s), NAN), dw_ref(w_size(s), NAN);
      cpu::conv2d_backward_data_direct(kSerial, s, dy.data(), w.data(), dx_ref.data());
      cpu::conv2d_backward_weight_direct(kSerial, s, x.data(), dy.data(), dw_ref.data());
      for (kemu::ImplicitCore core : {kemu::ImplicitCore::wmma, kemu::ImplicitCore::mma}) {
        CAPTURE(int(core));
        cpu::set_precision(cpu::Precision::tf32);
        kemu::set_conv2d_implicit_core(core);
        std::vector<float> yt(y_size(s), NAN), dx(x_size(s), NAN), dw(w_size(s), NAN);
        kemu::conv2d_forward_implicit(st, s, x.data(), w.data(), yt.data());
        kemu::conv2d_backward_data_implicit(st, s, dy.data(), w.data(), dx.data());
        kemu::conv2d_backward_weight_implicit(st, s, x.data(), dy.data(), dw.data());
        cpu::set_precision(saved);
        kemu::set_conv2d_implicit_core(kemu::ImplicitCore::wmma);
        CHECK(close(y_ref, yt, 1e-3 * double(K + 1), 1e-3, "conv2d_forward_implicit tf32"));
        CHECK(close(dx_ref, dx, 1e-3 * double(s.OC * s.KH * s.KW + 1), 1e-3, "conv2d_backward_data_implicit tf32"));
        CHECK(close(dw_ref, dw, 1e-3 * double(s.N * P + 1), 1e-3, "conv2d_backward_weight_implicit tf32"));
      }
    }

    // im2col / col2im of the last image against the CPU helpers.
    const float* x_last = x.data() + (s.N - 1) * s.C * s.H * s.W;
    std::vector<float> col(K * P, NAN), col_ref(K * P, NAN);
    kemu::im2col(st, s, x_last, col.data());
    cpu::im2col(s, x_last, col_ref.data());
    CHECK(same_bits(col_ref, col, "im2col"));
    const auto c = lcg_data(K * P, 43);
    std::vector<float> img(s.C * s.H * s.W, 0.0f), img_ref(img);
    kemu::col2im(st, s, c.data(), img.data());
    cpu::col2im(s, c.data(), img_ref.data());
    CHECK(close(img_ref, img, 1e-6, 1e-5, "col2im into zeros"));
    kemu::col2im(st, s, c.data(), img.data());  // adds to what is there
    cpu::col2im(s, c.data(), img_ref.data());
    CHECK(close(img_ref, img, 1e-6, 1e-5, "col2im adding"));
  }
}

// A member's three emulated passes (forward, backward_data, backward_weight), named for the messages.
struct Passes {
  const char* name;
  decltype(&kemu::conv2d_forward) forward;
  decltype(&kemu::conv2d_backward_data) data;
  decltype(&kemu::conv2d_backward_weight) weight;
};

}  // namespace

TEST_CASE("emulated conv2d (im2col + tiled GEMM, direct, implicit GEMM) matches the CPU") { check_conv(nullptr); }

// ---- backward passes against central differences of the emulated forward
TEST_CASE("emulated conv2d backward_data and backward_weight match finite differences") {
  const Conv shapes[] = {{1, 2, 7, 5, 3, 3, 3, 2, 2, 1, 1}, {2, 3, 4, 5, 2, 1, 1, 1, 1, 0, 0},
                         {1, 1, 7, 5, 2, 5, 5, 1, 1, 2, 2}, {2, 2, 5, 6, 2, 1, 1, 2, 2, 0, 0}};
  for (const Conv& s : shapes) {
    INFO(describe(s));
    const auto x = lcg_data(x_size(s), 70), w = lcg_data(w_size(s), 71), r = lcg_data(y_size(s), 72);
    // The launchers (the member set_conv2d_kernel chose), then kernel5 (implicit GEMM): each one's
    // backward passes against differences of its own forward. Linear in x and in w: a wide step.
    const Passes passes[] = {{"conv2d", kemu::conv2d_forward, kemu::conv2d_backward_data, kemu::conv2d_backward_weight},
                             {"conv2d implicit", kemu::conv2d_forward_implicit, kemu::conv2d_backward_data_implicit,
                              kemu::conv2d_backward_weight_implicit}};
    for (const Passes& p : passes) {
      std::vector<float> dx(x_size(s)), dw(w_size(s));
      p.data(nullptr, s, r.data(), w.data(), dx.data());
      p.weight(nullptr, s, x.data(), r.data(), dw.data());
      // The loss sum(r * y) of the forward at (x, w).
      auto loss = [&](const std::vector<float>& xv, const std::vector<float>& wv) {
        std::vector<float> y(y_size(s));
        p.forward(nullptr, s, xv.data(), wv.data(), y.data());
        return dot(to_double(y), r);
      };
      auto loss_x = [&](const std::vector<double>& xd) { return loss(to_float(xd), w); };
      auto loss_w = [&](const std::vector<double>& wd) { return loss(x, to_float(wd)); };
      CHECK(grad_check(x, dx, loss_x, {5e-2}, (std::string(p.name) + " dx").c_str()));
      CHECK(grad_check(w, dw, loss_w, {5e-2}, (std::string(p.name) + " dw").c_str()));
    }
  }
}

TEST_CASE("emulated conv2d on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_conv(&two.ctx);
}
