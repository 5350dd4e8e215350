// Emulated conv2d (im2col + tiled GEMM, and the direct kernel), pool2d and batch_norm kernels
// against their kernels/cpu twins on odd shapes, and every emulated backward against central
// finite differences of the emulated forward (a gradient x1.05 must fail the same check).
// Tolerances (d2l::test::close: |ref - x| <= atol + rtol |ref|; data in [-1, 1)):
//   bitwise       im2col (copies), max pool forward and argmax (a selection), global avg pool
//                 backward and batch_norm eval (the same float operations per element)
//   1e-6/1e-5     float sums of a few terms whose order the CPU is free to change: col2im, max/avg
//                 pool backward (windows overlapping an input), avg pool forward (atol 1e-6, rtol 1e-5)
//   conv2d        float sums of k products (tiled GEMM or direct loop vs OpenBLAS): atol 1e-5 (k + 1),
//                 rtol 1e-5 with k = C*KH*KW (forward), OC*KH*KW (data), N*OH*OW (weight)
//   1e-6/1e-6     global avg pool forward and batch_norm statistics (double sums, another order);
//                 batch_norm y and backward: atol 1e-5 rtol 1e-5 (float arithmetic on those)
//   FD            atol 1e-3, rtol 1e-2 (test_emu_ops.hpp); h 5e-2 for linear maps, 1e-2 else,
//                 1e-3 for max pooling on values 0.01 apart (no step changes a window's winner)
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "test_emu_ops.hpp"

using namespace emu_ops;
using Conv = cpu::Conv2dShape;
using Pool = cpu::Pool2dShape;

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
    // Both backward passes of one member (kernel2, then kernel1), emulated against the CPU's member.
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

// {N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w}
const Pool kPoolShapes[] = {
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
int64_t x_size(const Pool& s) { return s.N * s.C * s.H * s.W; }
int64_t y_size(const Pool& s) { return s.N * s.C * s.OH() * s.OW(); }

void check_pool(kemu::Stream st) {
  for (const Pool& s : kPoolShapes) {
    INFO("pool N" << s.N << " C" << s.C << " " << s.H << "x" << s.W << " k" << s.KH << "x" << s.KW << " s"
                  << s.stride_h << "," << s.stride_w << " p" << s.pad_h << "," << s.pad_w);
    auto x = lcg_data(x_size(s), 50);
    for (size_t i = 0; i < x.size(); i += 5) x[i] = x[i / 5 % x.size()];  // some repeated values: ties
    if (x.size() > 3) x[3] = NAN;                                          // a NaN wins its windows
    const auto dy = lcg_data(y_size(s), 51);
    std::vector<float> y(y_size(s), -7.0f), y_ref(y);
    std::vector<int32_t> arg(y_size(s), -7), arg_ref(arg);
    kemu::max_pool2d_forward(st, s, x.data(), y.data(), arg.data());
    cpu::max_pool2d_forward(kSerial, s, x.data(), y_ref.data(), arg_ref.data());
    CHECK(same_bits(y_ref, y, "max_pool2d_forward y"));
    CHECK(arg == arg_ref);
    std::vector<float> dx(x_size(s), -7.0f), dx_ref(dx);
    kemu::max_pool2d_backward(st, s, dy.data(), arg_ref.data(), dx.data());
    cpu::max_pool2d_backward(kSerial, s, dy.data(), arg_ref.data(), dx_ref.data());
    CHECK(close(dx_ref, dx, 1e-6, 1e-5, "max_pool2d_backward"));

    x[3] = 0.25f;
    kemu::avg_pool2d_forward(st, s, x.data(), y.data());
    cpu::avg_pool2d_forward(kSerial, s, x.data(), y_ref.data());
    CHECK(close(y_ref, y, 1e-6, 1e-5, "avg_pool2d_forward"));
    kemu::avg_pool2d_backward(st, s, dy.data(), dx.data());
    cpu::avg_pool2d_backward(kSerial, s, dy.data(), dx_ref.data());
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
    cpu::global_avg_pool_forward(kSerial, g.N, g.C, g.HW, x.data(), y_ref.data());
    CHECK(close(y_ref, y, 1e-6, 1e-6, "global_avg_pool_forward"));
    kemu::global_avg_pool_backward(st, g.N, g.C, g.HW, dy.data(), dx.data());
    cpu::global_avg_pool_backward(kSerial, g.N, g.C, g.HW, dy.data(), dx_ref.data());
    CHECK(same_bits(dx_ref, dx, "global_avg_pool_backward"));
  }
}

// (N, C, HW): M = N*HW values per channel, from one (running variance: biased) to more than a block.
struct Bn {
  int64_t N, C, HW;
};
const Bn kBnShapes[] = {{4, 3, 5}, {1, 2, 1}, {2, 1, 1}, {2, 5, 49}, {7, 1, 13}, {64, 4, 1}, {3, 2, 300}};

struct BnState {
  std::vector<float> y, mean, invstd, rm, rv;
};
BnState bn_state(const Bn& b) {
  BnState st{std::vector<float>(b.N * b.C * b.HW, NAN), std::vector<float>(b.C, NAN),
             std::vector<float>(b.C, NAN), lcg_data(b.C, 60), lcg_data(b.C, 61)};
  for (float& v : st.rv) v = v + 1.5f;  // a variance is positive
  return st;
}
std::vector<float> gamma_for(int64_t C) {
  auto g = lcg_data(C, 62);
  for (float& v : g) v += 1.5f;  // in [0.5, 2.5)
  return g;
}

void check_batch_norm(kemu::Stream st) {
  const float eps = 1e-5f, momentum = 0.1f;
  for (const Bn& b : kBnShapes) {
    INFO("bn N" << b.N << " C" << b.C << " HW" << b.HW);
    const int64_t n = b.N * b.C * b.HW;
    const auto x = lcg_data(n, 63), dy = lcg_data(n, 64), gamma = gamma_for(b.C), beta = lcg_data(b.C, 65);
    BnState e = bn_state(b), c = bn_state(b);
    kemu::batch_norm_train_forward(st, b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), eps, momentum,
                                   e.y.data(), e.mean.data(), e.invstd.data(), e.rm.data(), e.rv.data());
    cpu::batch_norm_train_forward(kSerial, b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), eps, momentum,
                                  c.y.data(), c.mean.data(), c.invstd.data(), c.rm.data(), c.rv.data());
    CHECK(close(c.y, e.y, 1e-5, 1e-5, "bn train y"));
    CHECK(close(c.mean, e.mean, 1e-6, 1e-6, "bn mean"));
    CHECK(close(c.invstd, e.invstd, 1e-6, 1e-6, "bn invstd"));
    CHECK(close(c.rm, e.rm, 1e-6, 1e-6, "bn running_mean"));
    CHECK(close(c.rv, e.rv, 1e-6, 1e-6, "bn running_var"));

    std::vector<float> y(n, NAN), y_ref(n, NAN);
    kemu::batch_norm_eval_forward(st, b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), c.rm.data(),
                                  c.rv.data(), eps, y.data());
    cpu::batch_norm_eval_forward(kSerial, b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), c.rm.data(),
                                 c.rv.data(), eps, y_ref.data());
    CHECK(same_bits(y_ref, y, "bn eval y"));

    // Backward from the CPU's saved statistics, so that only the backward kernels differ.
    std::vector<float> dx(n, NAN), dx_ref(n, NAN), dg(b.C, NAN), dg_ref(b.C, NAN), db(b.C, NAN), db_ref(b.C, NAN);
    kemu::batch_norm_backward(st, b.N, b.C, b.HW, x.data(), dy.data(), gamma.data(), c.mean.data(),
                              c.invstd.data(), dx.data(), dg.data(), db.data());
    cpu::batch_norm_backward(kSerial, b.N, b.C, b.HW, x.data(), dy.data(), gamma.data(), c.mean.data(),
                             c.invstd.data(), dx_ref.data(), dg_ref.data(), db_ref.data());
    CHECK(close(dx_ref, dx, 1e-5, 1e-5, "bn dx"));
    CHECK(close(dg_ref, dg, 1e-6, 1e-6, "bn dgamma"));
    CHECK(close(db_ref, db, 1e-6, 1e-6, "bn dbeta"));
  }
}

}  // namespace

TEST_CASE("emulated conv2d (im2col + tiled GEMM, direct) matches the CPU") { check_conv(nullptr); }
TEST_CASE("emulated max, avg and global avg pooling match the CPU") { check_pool(nullptr); }
TEST_CASE("emulated batch_norm matches the CPU") { check_batch_norm(nullptr); }

// ---- backward passes against central differences of the emulated forward
TEST_CASE("emulated conv2d backward_data and backward_weight match finite differences") {
  const Conv shapes[] = {{1, 2, 7, 5, 3, 3, 3, 2, 2, 1, 1}, {2, 3, 4, 5, 2, 1, 1, 1, 1, 0, 0},
                         {1, 1, 7, 5, 2, 5, 5, 1, 1, 2, 2}, {2, 2, 5, 6, 2, 1, 1, 2, 2, 0, 0}};
  for (const Conv& s : shapes) {
    INFO(describe(s));
    const auto x = lcg_data(x_size(s), 70), w = lcg_data(w_size(s), 71), r = lcg_data(y_size(s), 72);
    std::vector<float> dx(x_size(s)), dw(w_size(s));
    kemu::conv2d_backward_data(nullptr, s, r.data(), w.data(), dx.data());
    kemu::conv2d_backward_weight(nullptr, s, x.data(), r.data(), dw.data());
    auto loss_x = [&](const std::vector<double>& xd) {
      const auto xf = to_float(xd);
      std::vector<float> y(y_size(s));
      kemu::conv2d_forward(nullptr, s, xf.data(), w.data(), y.data());
      return dot(to_double(y), r);
    };
    auto loss_w = [&](const std::vector<double>& wd) {
      const auto wf = to_float(wd);
      std::vector<float> y(y_size(s));
      kemu::conv2d_forward(nullptr, s, x.data(), wf.data(), y.data());
      return dot(to_double(y), r);
    };
    CHECK(grad_check(x, dx, loss_x, {5e-2}, "conv2d dx"));  // linear in x and in w: a wide step
    CHECK(grad_check(w, dw, loss_w, {5e-2}, "conv2d dw"));
  }
}

// Values 0.01 apart in random order: a step of h = 1e-3 never changes which value wins a window.
std::vector<float> distinct_values(int64_t n, uint32_t seed) {
  const auto key = lcg_data(n, seed);
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] < key[b]; });
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) x[order[k]] = 0.01f * static_cast<float>(k - n / 2);
  return x;
}

TEST_CASE("emulated pooling backward passes match finite differences") {
  const Pool shapes[] = {{1, 1, 7, 5, 3, 3, 2, 2, 1, 1}, {2, 2, 7, 6, 3, 3, 1, 1, 1, 1}, {1, 2, 9, 8, 2, 2, 2, 2, 0, 0}};
  for (const Pool& s : shapes) {
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

TEST_CASE("emulated batch_norm_backward matches finite differences (dx, dgamma, dbeta)") {
  for (const Bn& b : {Bn{4, 3, 5}, Bn{3, 1, 2}, Bn{2, 2, 7}, Bn{1, 2, 1}}) {
    INFO("bn N" << b.N << " C" << b.C << " HW" << b.HW);
    const bool degenerate = b.N * b.HW == 1;  // one value a channel: y = beta, dx = 0 = dgamma
    const int64_t n = b.N * b.C * b.HW;
    const auto x = lcg_data(n, 90), r = lcg_data(n, 91), gamma = gamma_for(b.C), beta = lcg_data(b.C, 92);
    // y of the emulated training forward (fresh running statistics each time)
    auto forward = [&](const std::vector<float>& xf, const std::vector<float>& g, const std::vector<float>& be) {
      BnState s = bn_state(b);
      kemu::batch_norm_train_forward(nullptr, b.N, b.C, b.HW, xf.data(), g.data(), be.data(), 1e-5f, 0.1f,
                                     s.y.data(), s.mean.data(), s.invstd.data(), s.rm.data(), s.rv.data());
      return s;
    };
    const BnState s = forward(x, gamma, beta);
    std::vector<float> dx(n), dg(b.C), db(b.C);
    kemu::batch_norm_backward(nullptr, b.N, b.C, b.HW, x.data(), r.data(), gamma.data(), s.mean.data(),
                              s.invstd.data(), dx.data(), dg.data(), db.data());
    auto loss_x = [&](const std::vector<double>& v) { return dot(to_double(forward(to_float(v), gamma, beta).y), r); };
    auto loss_g = [&](const std::vector<double>& v) { return dot(to_double(forward(x, to_float(v), beta).y), r); };
    auto loss_b = [&](const std::vector<double>& v) { return dot(to_double(forward(x, gamma, to_float(v)).y), r); };
    CHECK(grad_check(x, dx, loss_x, {1e-2}, "batch_norm dx", !degenerate));
    CHECK(grad_check(gamma, dg, loss_g, {5e-2}, "batch_norm dgamma", !degenerate));  // linear in gamma
    CHECK(grad_check(beta, db, loss_b, {5e-2}, "batch_norm dbeta"));                  // and in beta
  }
}

TEST_CASE("emulated conv2d, pool2d, batch_norm on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_conv(&two.ctx);
  check_pool(&two.ctx);
  check_batch_norm(&two.ctx);
}
