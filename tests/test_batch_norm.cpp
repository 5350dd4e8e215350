// Batch norm on every backend: the CPU kernels (kernels/cpu/batch_norm.cpp) against direct per-channel
// loops in double, the training backward against central finite differences of that reference, and
// the running statistics against a hand computation; 1, 2 and 3 threads. The emulated CUDA kernels
// (kernels/cuda/batch_norm.cu) against the CPU's, and their backward against finite differences of the
// emulated forward (a gradient x1.05 must fail the same check).
// Tolerances of the emulated kernels (d2l::test::close: |ref - x| <= atol + rtol |ref|; data in [-1, 1)):
//   bitwise       eval forward (the same float operations per element)
//   1e-6/1e-6     the statistics, dgamma, dbeta (double sums, another order)
//   1e-5/1e-5     training y and dx (float arithmetic on those)
//   FD            atol 1e-3, rtol 1e-2 (FdTol, tests/emu_check.hpp); h 5e-2 for gamma and beta (linear), 1e-2 for x
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "check.hpp"
#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"

// x (N, C, HW), per-channel gamma/beta (C). Training: batch mean/var (biased) normalise; saves mean and
// invstd = 1/sqrt(var + eps) (C each); running_mean/var (C) updated as running = (1 - momentum) *
// running + momentum * batch, with the unbiased batch variance for running_var (PyTorch's convention;
// momentum 0.1 there). Evaluation normalises with the running statistics. The backward is training
// mode's (batch statistics depend on x); dx, dgamma, dbeta overwritten.
D2L_DECLARE_KERNEL(batch_norm_train_forward, int64_t N, int64_t C, int64_t HW, const float* x, const float* gamma,
                   const float* beta, float eps, float momentum, float* y, float* mean, float* invstd,
                   float* running_mean, float* running_var);
D2L_DECLARE_KERNEL(batch_norm_eval_forward, int64_t N, int64_t C, int64_t HW, const float* x, const float* gamma,
                   const float* beta, const float* running_mean, const float* running_var, float eps, float* y);
D2L_DECLARE_KERNEL(batch_norm_backward, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                   const float* gamma, const float* mean, const float* invstd, float* dx, float* dgamma, float* dbeta);

using d2l::kernels::cpu::Ctx;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

struct Shape {
  int64_t N, C, HW;
  int64_t size() const { return N * C * HW; }
};
const std::vector<Shape> kShapes = {
    {1, 1, 7},   // batch 1, one channel
    {4, 3, 1},   // dense layer (HW = 1)
    {2, 5, 13},  // odd sizes
    {3, 2, 35},  // 7x5 feature maps
    {1, 3, 1},   // one value per channel: var 0, y = beta, dx = 0
};
constexpr float kEps = 1e-5f;

// Training-mode forward in double: per channel, biased batch statistics.
struct Ref {
  std::vector<double> y, mean, var;
};
Ref ref_train(const Shape& s, const std::vector<double>& x, const std::vector<double>& gamma,
              const std::vector<double>& beta) {
  Ref r{std::vector<double>(x.size()), std::vector<double>(s.C, 0.0), std::vector<double>(s.C, 0.0)};
  const double M = double(s.N * s.HW);
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) r.mean[c] += x[(n * s.C + c) * s.HW + i] / M;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) {
        double d = x[(n * s.C + c) * s.HW + i] - r.mean[c];
        r.var[c] += d * d / M;
      }
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) {
        int64_t k = (n * s.C + c) * s.HW + i;
        r.y[k] = gamma[c] * (x[k] - r.mean[c]) / std::sqrt(r.var[c] + kEps) + beta[c];
      }
  }
  return r;
}

struct Out {
  std::vector<float> y, mean, invstd, running_mean, running_var;
};
Out train_forward(const Ctx& c, const Shape& s, const std::vector<float>& x, const std::vector<float>& gamma,
                  const std::vector<float>& beta, float momentum = 0.1f) {
  Out o{std::vector<float>(x.size(), -7.0f), std::vector<float>(s.C, -7.0f), std::vector<float>(s.C, -7.0f),
        std::vector<float>(s.C, 0.0f), std::vector<float>(s.C, 1.0f)};
  d2l::kernels::cpu::batch_norm_train_forward(c, s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(), kEps,
                                              momentum, o.y.data(), o.mean.data(), o.invstd.data(),
                                              o.running_mean.data(), o.running_var.data());
  return o;
}

struct Grads {
  std::vector<float> dx, dgamma, dbeta;
};
Grads backward(const Ctx& c, const Shape& s, const std::vector<float>& x, const std::vector<float>& dy,
               const std::vector<float>& gamma, const Out& o) {
  Grads g{std::vector<float>(x.size(), -7.0f), std::vector<float>(s.C, -7.0f),
          std::vector<float>(s.C, -7.0f)};
  d2l::kernels::cpu::batch_norm_backward(c, s.N, s.C, s.HW, x.data(), dy.data(), gamma.data(), o.mean.data(),
                                         o.invstd.data(), g.dx.data(), g.dgamma.data(), g.dbeta.data());
  return g;
}

std::vector<float> gamma_of(int64_t C) {  // away from zero, so dx is not trivially small
  auto g = lcg_data(C, 11);
  for (auto& v : g) v = 1.0f + 0.5f * v;
  return g;
}

}  // namespace

TEST_CASE("batch_norm training forward matches direct loops") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    auto x = lcg_data(s.size(), 1), gamma = gamma_of(s.C), beta = lcg_data(s.C, 2);
    for (auto& v : x) v = 3.0f + 2.0f * v;  // mean far from 0, var far from 1
    auto ref = ref_train(s, d2l::test::to_double(x), d2l::test::to_double(gamma), d2l::test::to_double(beta));
    std::vector<double> invstd(s.C);
    for (int64_t c = 0; c < s.C; ++c) invstd[c] = 1 / std::sqrt(ref.var[c] + kEps);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      auto o = train_forward(c, s, x, gamma, beta);
      CHECK(close(ref.y, o.y, 1e-5, 1e-5, "y"));
      CHECK(close(ref.mean, o.mean, 1e-6, 1e-6, "mean"));
      CHECK(close(invstd, o.invstd, 0, 1e-6, "invstd"));
    });
  }
}

// BN is smooth but not linear: the central-difference error is O(h^2) (h = 1e-3, ~1e-5 here), so
// atol 1e-4, rtol 1e-3.
TEST_CASE("batch_norm backward matches finite differences (dx, dgamma, dbeta)") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    auto x = lcg_data(s.size(), 3), gamma = gamma_of(s.C), beta = lcg_data(s.C, 4), r = lcg_data(s.size(), 5);
    const auto xd = d2l::test::to_double(x), gd = d2l::test::to_double(gamma),
               bd = d2l::test::to_double(beta);
    const double h = 1e-3;
    using V = std::vector<double>;
    auto fd_x = d2l::test::fd_gradient(
        x, [&](const V& v) { return d2l::test::dot(ref_train(s, v, gd, bd).y, r); }, h);
    auto fd_g = d2l::test::fd_gradient(
        gamma, [&](const V& v) { return d2l::test::dot(ref_train(s, xd, v, bd).y, r); }, h);
    auto fd_b = d2l::test::fd_gradient(
        beta, [&](const V& v) { return d2l::test::dot(ref_train(s, xd, gd, v).y, r); }, h);
    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      auto g = backward(c, s, x, r, gamma, train_forward(c, s, x, gamma, beta));
      CHECK(d2l::test::fd_agrees(fd_x, g.dx, 1e-4, 1e-3, "dx"));
      CHECK(d2l::test::fd_agrees(fd_g, g.dgamma, 1e-4, 1e-3, "dgamma"));
      CHECK(d2l::test::fd_agrees(fd_b, g.dbeta, 1e-4, 1e-3, "dbeta"));
    });
  }
}

TEST_CASE("batch_norm running statistics after 3 training steps, then eval forward") {
  for (const auto& s : kShapes) {
    CAPTURE(s.N);
    CAPTURE(s.C);
    CAPTURE(s.HW);
    const double momentum = 0.1;
    auto gamma = gamma_of(s.C), beta = lcg_data(s.C, 6);
    std::vector<std::vector<float>> batches;
    for (uint32_t step = 0; step < 3; ++step) {
      auto x = lcg_data(s.size(), 20 + step);
      for (auto& v : x) v = float(step) + (1.0f + step) * v;  // statistics change between steps
      batches.push_back(x);
    }
    // By hand: running = (1 - momentum) * running + momentum * batch statistic, from (0, 1); the
    // variance unbiased (sum of squares / (M - 1)), or biased when M == 1.
    const int64_t M = s.N * s.HW;
    std::vector<double> rmean(s.C, 0.0), rvar(s.C, 1.0);
    for (const auto& x : batches)
      for (int64_t c = 0; c < s.C; ++c) {
        double sum = 0, sq = 0;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t i = 0; i < s.HW; ++i) sum += x[(n * s.C + c) * s.HW + i];
        const double mean = sum / M;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t i = 0; i < s.HW; ++i) sq += std::pow(x[(n * s.C + c) * s.HW + i] - mean, 2);
        rmean[c] = (1 - momentum) * rmean[c] + momentum * mean;
        rvar[c] = (1 - momentum) * rvar[c] + momentum * (M > 1 ? sq / (M - 1) : sq / M);
      }
    auto x_eval = lcg_data(s.size(), 30);
    std::vector<double> y_ref(x_eval.size());
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t c = 0; c < s.C; ++c)
        for (int64_t i = 0; i < s.HW; ++i) {
          int64_t k = (n * s.C + c) * s.HW + i;
          y_ref[k] = gamma[c] * (x_eval[k] - rmean[c]) / std::sqrt(rvar[c] + kEps) + beta[c];
        }

    d2l::test::for_thread_counts([&](const Ctx& c) {
      CAPTURE(c.threads);
      std::vector<float> rm(s.C, 0.0f), rv(s.C, 1.0f), y(s.size()), mean(s.C), invstd(s.C);
      for (const auto& x : batches)
        d2l::kernels::cpu::batch_norm_train_forward(c, s.N, s.C, s.HW, x.data(), gamma.data(), beta.data(),
                                                    kEps, float(momentum), y.data(), mean.data(),
                                                    invstd.data(), rm.data(), rv.data());
      CHECK(close(rmean, rm, 1e-6, 1e-6, "running_mean"));
      CHECK(close(rvar, rv, 1e-6, 1e-6, "running_var"));
      std::vector<float> y_eval(s.size(), -7.0f);
      d2l::kernels::cpu::batch_norm_eval_forward(c, s.N, s.C, s.HW, x_eval.data(), gamma.data(), beta.data(),
                                                 rm.data(), rv.data(), kEps, y_eval.data());
      CHECK(close(y_ref, y_eval, 1e-5, 1e-5, "eval y"));
    });
  }
}

TEST_CASE("batch_norm finite-difference check rejects broken gradients") {
  const Shape s{2, 5, 13};
  auto x = lcg_data(s.size(), 3), gamma = gamma_of(s.C), beta = lcg_data(s.C, 4), r = lcg_data(s.size(), 5);
  const auto gd = d2l::test::to_double(gamma), bd = d2l::test::to_double(beta);
  auto loss = [&](const std::vector<double>& v) { return d2l::test::dot(ref_train(s, v, gd, bd).y, r); };
  const Ctx c = d2l::kernels::cpu::serial_ctx();
  auto o = train_forward(c, s, x, gamma, beta);
  auto g = backward(c, s, x, r, gamma, o);
  REQUIRE(d2l::test::fd_check(x, g.dx, loss, 1e-3, 1e-4, 1e-3));

  auto scaled = g.dx;
  for (auto& v : scaled) v *= 1.05f;
  CHECK_FALSE(d2l::test::fd_check(x, scaled, loss, 1e-3, 1e-4, 1e-3, 400, {}, "dx*1.05 (expected)"));
  // The eval-mode formula dx = gamma * invstd * dy ignores that the batch statistics depend on x.
  std::vector<float> eval_mode(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t ch = 0; ch < s.C; ++ch)
      for (int64_t i = 0; i < s.HW; ++i) {
        int64_t k = (n * s.C + ch) * s.HW + i;
        eval_mode[k] = gamma[ch] * o.invstd[ch] * r[k];
      }
  CHECK_FALSE(d2l::test::fd_check(x, eval_mode, loss, 1e-3, 1e-4, 1e-3, 400, {}, "eval-mode dx (expected)"));
}

// ---- the emulated CUDA kernels against the CPU's
namespace {
namespace cpu = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
using namespace d2l::test;  // check.hpp, emu_check.hpp, fd_check.hpp

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
    cpu::batch_norm_train_forward(cpu::serial_ctx(), b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), eps, momentum,
                                  c.y.data(), c.mean.data(), c.invstd.data(), c.rm.data(), c.rv.data());
    CHECK(close(c.y, e.y, 1e-5, 1e-5, "bn train y"));
    CHECK(close(c.mean, e.mean, 1e-6, 1e-6, "bn mean"));
    CHECK(close(c.invstd, e.invstd, 1e-6, 1e-6, "bn invstd"));
    CHECK(close(c.rm, e.rm, 1e-6, 1e-6, "bn running_mean"));
    CHECK(close(c.rv, e.rv, 1e-6, 1e-6, "bn running_var"));

    std::vector<float> y(n, NAN), y_ref(n, NAN);
    kemu::batch_norm_eval_forward(st, b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), c.rm.data(),
                                  c.rv.data(), eps, y.data());
    cpu::batch_norm_eval_forward(cpu::serial_ctx(), b.N, b.C, b.HW, x.data(), gamma.data(), beta.data(), c.rm.data(),
                                 c.rv.data(), eps, y_ref.data());
    CHECK(same_bits(y_ref, y, "bn eval y"));

    // Backward from the CPU's saved statistics, so that only the backward kernels differ.
    std::vector<float> dx(n, NAN), dx_ref(n, NAN), dg(b.C, NAN), dg_ref(b.C, NAN), db(b.C, NAN), db_ref(b.C, NAN);
    kemu::batch_norm_backward(st, b.N, b.C, b.HW, x.data(), dy.data(), gamma.data(), c.mean.data(),
                              c.invstd.data(), dx.data(), dg.data(), db.data());
    cpu::batch_norm_backward(cpu::serial_ctx(), b.N, b.C, b.HW, x.data(), dy.data(), gamma.data(), c.mean.data(),
                             c.invstd.data(), dx_ref.data(), dg_ref.data(), db_ref.data());
    CHECK(close(dx_ref, dx, 1e-5, 1e-5, "bn dx"));
    CHECK(close(dg_ref, dg, 1e-6, 1e-6, "bn dgamma"));
    CHECK(close(db_ref, db, 1e-6, 1e-6, "bn dbeta"));
  }
}

}  // namespace

D2L_EMULATED_CASES("emulated batch_norm matches the CPU",
                   "emulated batch_norm on 2 device threads", check_batch_norm)

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

// ---- the chunked passes (kernels/cuda/channel_chunks.cuh): a channel's values are cut into chunks of
// 2048 loads under the emulation (32 threads x 64 loads; a load is a float4 when HW % 4 == 0 and the
// tensors are 16-byte aligned, else one float). The shapes put several chunks in a channel, with
// boundaries inside a plane; the partials are combined in chunk order (Chan's formula forward).
namespace {

struct Chunked {
  Bn shape;
  const char* what;
};
const Chunked kChunkedShapes[] = {
    {{24, 2, 784}, "float4 loads, 3 chunks a channel, boundaries inside a 28x28 plane"},
    {{5000, 2, 1}, "dense (HW 1): scalar loads, 3 chunks"},
    {{60, 2, 75}, "HW not a multiple of 4: scalar loads, 3 chunks, the last one short"},
    {{1, 3, 9001}, "N 1, scalar loads, 5 chunks"},
    {{1, 2, 10000}, "N 1, float4 loads, 2 chunks"},
    {{1, 2, 1}, "M 1: one value a channel"},
};

// Everything the emulated training forward and backward write, for one input.
struct BnRun {
  BnState fwd;
  std::vector<float> dx, dgamma, dbeta;
};

// Input of a chunked case: x with its mean far from 0 and its spread far from 1 (a one-pass sum of
// squares would lose digits), dy, gamma, beta. `offset` floats before x and dy move them off a
// 16-byte boundary.
struct BnInput {
  std::vector<float> x_buf, dy_buf, gamma, beta;
  int64_t offset;
  const float* x() const { return x_buf.data() + offset; }
  const float* dy() const { return dy_buf.data() + offset; }
};
BnInput bn_input(const Bn& b, int64_t offset = 0) {
  const int64_t n = b.N * b.C * b.HW;
  BnInput in{lcg_data(n + offset, 70), lcg_data(n + offset, 71), gamma_for(b.C), lcg_data(b.C, 72), offset};
  for (float& v : in.x_buf) v = 3.0f + 2.0f * v;
  return in;
}

BnRun run_emulated(kemu::Stream st, const Bn& b, const BnInput& in, int64_t out_offset = 0) {
  const int64_t n = b.N * b.C * b.HW;
  BnRun r{bn_state(b), {}, std::vector<float>(b.C, NAN), std::vector<float>(b.C, NAN)};
  std::vector<float> y(n + out_offset, NAN), dx(n + out_offset, NAN);
  kemu::batch_norm_train_forward(st, b.N, b.C, b.HW, in.x(), in.gamma.data(), in.beta.data(), kEps, 0.1f,
                                 y.data() + out_offset, r.fwd.mean.data(), r.fwd.invstd.data(), r.fwd.rm.data(),
                                 r.fwd.rv.data());
  kemu::batch_norm_backward(st, b.N, b.C, b.HW, in.x(), in.dy(), in.gamma.data(), r.fwd.mean.data(),
                            r.fwd.invstd.data(), dx.data() + out_offset, r.dgamma.data(), r.dbeta.data());
  r.fwd.y.assign(y.begin() + out_offset, y.end());
  r.dx.assign(dx.begin() + out_offset, dx.end());
  return r;
}

// The emulated run against the CPU's kernels and, forward, against the double loops (ref_train).
void check_against_cpu(const Bn& b, const BnInput& in, const BnRun& e) {
  const int64_t n = b.N * b.C * b.HW;
  BnState c = bn_state(b);
  cpu::batch_norm_train_forward(cpu::serial_ctx(), b.N, b.C, b.HW, in.x(), in.gamma.data(), in.beta.data(), kEps,
                                0.1f, c.y.data(), c.mean.data(), c.invstd.data(), c.rm.data(), c.rv.data());
  CHECK(close(c.y, e.fwd.y, 1e-5, 1e-5, "y"));
  CHECK(close(c.mean, e.fwd.mean, 1e-6, 1e-6, "mean"));
  CHECK(close(c.invstd, e.fwd.invstd, 1e-6, 1e-6, "invstd"));
  CHECK(close(c.rm, e.fwd.rm, 1e-6, 1e-6, "running_mean"));
  CHECK(close(c.rv, e.fwd.rv, 1e-6, 1e-6, "running_var"));

  const Shape s{b.N, b.C, b.HW};
  const std::vector<float> x(in.x(), in.x() + n);
  const auto ref = ref_train(s, to_double(x), to_double(in.gamma), to_double(in.beta));
  std::vector<double> invstd(b.C);
  for (int64_t ch = 0; ch < b.C; ++ch) invstd[ch] = 1 / std::sqrt(ref.var[ch] + kEps);
  CHECK(close(ref.y, e.fwd.y, 1e-5, 1e-5, "y (double loops)"));
  CHECK(close(ref.mean, e.fwd.mean, 1e-6, 1e-6, "mean (double loops)"));
  CHECK(close(invstd, e.fwd.invstd, 0, 1e-6, "invstd (double loops)"));

  // Backward from the emulated statistics, so that only the backward kernels differ.
  std::vector<float> dx(n, NAN), dg(b.C, NAN), db(b.C, NAN);
  cpu::batch_norm_backward(cpu::serial_ctx(), b.N, b.C, b.HW, in.x(), in.dy(), in.gamma.data(), e.fwd.mean.data(),
                           e.fwd.invstd.data(), dx.data(), dg.data(), db.data());
  CHECK(close(dx, e.dx, 1e-5, 1e-5, "dx"));
  CHECK(close(dg, e.dgamma, 1e-6, 1e-6, "dgamma"));
  CHECK(close(db, e.dbeta, 1e-6, 1e-6, "dbeta"));
}

bool same_run(const BnRun& a, const BnRun& b) {
  bool ok = same_bits(a.fwd.y, b.fwd.y, "y");
  ok = same_bits(a.fwd.mean, b.fwd.mean, "mean") && ok;
  ok = same_bits(a.fwd.invstd, b.fwd.invstd, "invstd") && ok;
  ok = same_bits(a.fwd.rm, b.fwd.rm, "running_mean") && ok;
  ok = same_bits(a.fwd.rv, b.fwd.rv, "running_var") && ok;
  ok = same_bits(a.dx, b.dx, "dx") && ok;
  ok = same_bits(a.dgamma, b.dgamma, "dgamma") && ok;
  return same_bits(a.dbeta, b.dbeta, "dbeta") && ok;
}

}  // namespace

TEST_CASE("emulated batch_norm over several chunks a channel matches the CPU and double loops") {
  for (const Chunked& k : kChunkedShapes) {
    INFO(k.what << ": N" << k.shape.N << " C" << k.shape.C << " HW" << k.shape.HW);
    const BnInput in = bn_input(k.shape);
    check_against_cpu(k.shape, in, run_emulated(nullptr, k.shape, in));
  }
}

TEST_CASE("emulated batch_norm with HW a multiple of 4 but tensors off a 16-byte boundary loads floats") {
  const Bn b{24, 2, 784};
  for (int64_t offset : {1, 2, 3}) {
    INFO("offset " << offset << " floats");
    const BnInput in = bn_input(b, offset);
    check_against_cpu(b, in, run_emulated(nullptr, b, in, offset));
  }
  const BnInput in = bn_input(b);  // x aligned, y and dx not: floats as well
  check_against_cpu(b, in, run_emulated(nullptr, b, in, 1));
}

TEST_CASE("emulated batch_norm gives the same bits on a second run") {
  for (const Chunked& k : kChunkedShapes) {
    INFO(k.what);
    const BnInput in = bn_input(k.shape);
    CHECK(same_run(run_emulated(nullptr, k.shape, in), run_emulated(nullptr, k.shape, in)));
  }
}

TEST_CASE("emulated batch_norm gives the same bits on 1, 2 and 3 device threads" * doctest::test_suite("threads")) {
  d2l::kernels::cpu::ThreadPool pool2{1}, pool3{2};
  const d2l::kernels::cpu::Ctx two{2, &pool2}, three{3, &pool3};
  for (const Chunked& k : kChunkedShapes) {
    INFO(k.what);
    const BnInput in = bn_input(k.shape);
    const BnRun one = run_emulated(nullptr, k.shape, in);
    CHECK(same_run(one, run_emulated(&two, k.shape, in)));
    CHECK(same_run(one, run_emulated(&three, k.shape, in)));
  }
}
