// SyncBatchNorm and its ops (core/ops.hpp, kernels/cpu/batch_norm_stats.cpp):
//   kernels   statistics and apply against direct loops in double; combining the shards' statistics
//             equals the statistics of the concatenated shards; every backward against central
//             differences of the double reference (h 1e-3, atol 1e-4, rtol 1e-3: BN is smooth, the
//             O(h^2) error is ~1e-5), and the gradient x1.05 must fail that check
//   autograd  test::gradcheck of each op and of sync_batch_norm across two CPU devices; a mutated
//             backward must fail it
//   block     SyncBatchNorm on 2 and 3 CPU devices (uneven shards, an empty one) and on emu(0), emu(1)
//             equals batch_norm on the concatenated batch: outputs, gradients of every shard's x (one
//             backward per device loss, as the book), of gamma and beta summed over the replicas, the
//             running statistics of every replica, within atol 1e-5 rtol 1e-5; per-device BatchNorm
//             does not; evaluation uses each device's running statistics; one value per channel is an error
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/nn/sequential.hpp"
#include "core/nn/sync_batch_norm.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"

using namespace d2l;
using d2l::test::close;
using d2l::test::lcg_data;
using V = std::vector<double>;
namespace kc = d2l::kernels::cpu;

namespace {

constexpr float kEps = 1e-5f;
struct Sh {  // one shard x (N, C, HW)
  int64_t N, C, HW;
  int64_t size() const { return N * C * HW; }
};

// ---- references in double, direct loops
V ref_stats(const Sh& s, const V& x) {  // (2, C): mean, biased variance
  V st(2 * s.C, 0.0);
  const double M = double(s.N * s.HW);
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) st[c] += x[(n * s.C + c) * s.HW + i] / M;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t i = 0; i < s.HW; ++i) st[s.C + c] += std::pow(x[(n * s.C + c) * s.HW + i] - st[c], 2) / M;
  }
  return st;
}
V ref_combine(int64_t C, const std::vector<int32_t>& counts, const V& st) {  // the formula, for FD
  V out(2 * C, 0.0);
  double M = 0;
  for (int32_t n : counts) M += n;
  for (int64_t c = 0; c < C; ++c) {
    for (size_t j = 0; j < counts.size(); ++j) out[c] += counts[j] / M * st[2 * j * C + c];
    for (size_t j = 0; j < counts.size(); ++j)
      out[C + c] += counts[j] / M * (st[(2 * j + 1) * C + c] + std::pow(st[2 * j * C + c] - out[c], 2));
  }
  return out;
}
V ref_apply(const Sh& s, const V& x, const V& st, const V& g, const V& b) {
  V y(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t i = 0; i < s.HW; ++i) {
        const int64_t k = (n * s.C + c) * s.HW + i;
        y[k] = g[c] * (x[k] - st[c]) / std::sqrt(st[s.C + c] + kEps) + b[c];
      }
  return y;
}

// The analytic gradient agrees with central differences of `loss`, and the same gradient x1.05 does not.
bool fd_ok(const std::vector<float>& at, const std::vector<float>& grad, const test::LossFn& loss, const char* what) {
  const auto fd = test::fd_gradient(at, loss, 1e-3);
  int caught = 0;  // sampled points where the broken gradient is outside the tolerance
  for (size_t k = 0; k < fd.idx.size(); ++k) {
    const double broken = 1.05 * grad[size_t(fd.idx[k])], numeric = fd.numeric[k];
    caught += !(std::fabs(numeric - broken) <= 1e-4 + 1e-3 * std::fabs(numeric));
  }
  if (caught == 0) std::printf("  %s: the gradient x1.05 passed the check\n", what);
  return test::fd_agrees(fd, grad, 1e-4, 1e-3, what) && caught > 0;
}

std::vector<float> gamma_of(int64_t C) {  // in [0.5, 1.5): away from zero
  auto g = lcg_data(C, 11);
  for (auto& v : g) v = 1.0f + 0.5f * v;
  return g;
}
std::vector<float> shifted(int64_t n, uint32_t seed, float offset, float scale) {
  auto v = lcg_data(n, seed);
  for (auto& x : v) x = offset + scale * x;
  return v;
}

}  // namespace

TEST_CASE("batch_norm_stats kernels: statistics, combine = statistics of the concatenation, apply, running") {
  const Sh shards[] = {{5, 3, 7}, {4, 3, 7}, {1, 3, 7}};  // uneven, (N, C, HW)
  std::vector<float> all;
  std::vector<int32_t> counts;
  test::for_thread_counts([&](const kc::Ctx& c) {
    CAPTURE(c.threads);
    all.clear(), counts.clear();
    std::vector<float> stacked;
    for (int j = 0; j < 3; ++j) {
      const Sh& s = shards[j];
      auto x = shifted(s.size(), 20 + j, 3.0f * j, 1.0f + j);  // statistics differ between shards
      std::vector<float> st(2 * s.C, NAN);
      kc::batch_norm_stats_forward(c, s.N, s.C, s.HW, x.data(), st.data());
      CHECK(close(ref_stats(s, test::to_double(x)), st, 1e-6, 1e-6, "stats"));
      stacked.insert(stacked.end(), st.begin(), st.end());
      all.insert(all.end(), x.begin(), x.end());
      counts.push_back(int32_t(s.N * s.HW));
    }
    const Sh whole{10, 3, 7};
    const V want = ref_stats(whole, test::to_double(all));
    std::vector<float> got(6, NAN);
    kc::batch_norm_combine_forward(c, 3, 3, counts.data(), stacked.data(), got.data());
    CHECK(close(want, got, 1e-6, 1e-6, "combined stats"));

    const auto g = gamma_of(3), b = lcg_data(3, 12);
    std::vector<float> y(all.size(), NAN);
    kc::batch_norm_apply_forward(c, whole.N, whole.C, whole.HW, all.data(), got.data(), g.data(), b.data(), kEps, y.data());
    CHECK(close(ref_apply(whole, test::to_double(all), want, test::to_double(g), test::to_double(b)), y, 1e-5, 1e-5, "y"));

    std::vector<float> rm{0.5f, 0.0f, -1.0f}, rv{1.0f, 2.0f, 0.5f};
    kc::batch_norm_update_running(c, 3, 70, got.data(), 0.1f, rm.data(), rv.data());
    V rm_want{0.5, 0.0, -1.0}, rv_want{1.0, 2.0, 0.5};
    for (int ch = 0; ch < 3; ++ch) {
      rm_want[ch] = 0.9 * rm_want[ch] + 0.1 * want[ch];
      rv_want[ch] = 0.9 * rv_want[ch] + 0.1 * want[3 + ch] * 70.0 / 69.0;
    }
    CHECK(close(rm_want, rm, 1e-6, 1e-6, "running_mean"));
    CHECK(close(rv_want, rv, 1e-6, 1e-6, "running_var"));
  });
}

TEST_CASE("batch_norm_stats kernels: every backward matches central differences of the reference") {
  const kc::Ctx c = kc::serial_ctx();
  const Sh s{3, 2, 5};
  const auto x = shifted(s.size(), 30, 1.0f, 2.0f), g = gamma_of(s.C), b = lcg_data(s.C, 31);
  const auto r = lcg_data(s.size(), 32), rs = lcg_data(2 * s.C, 33);
  const V xd = test::to_double(x), gd = test::to_double(g), bd = test::to_double(b);

  std::vector<float> st(2 * s.C), dx(s.size(), NAN);
  kc::batch_norm_stats_forward(c, s.N, s.C, s.HW, x.data(), st.data());
  kc::batch_norm_stats_backward(c, s.N, s.C, s.HW, x.data(), st.data(), rs.data(), dx.data());
  CHECK(fd_ok(x, dx, [&](const V& v) { return test::dot(ref_stats(s, v), rs); }, "stats dx"));

  const std::vector<int32_t> counts{15, 4, 9};
  auto stacked = lcg_data(12, 34);  // (3, 2, 2): means in [-1, 1), variances in [0.5, 1.5)
  for (int j = 0; j < 3; ++j)
    for (int ch = 0; ch < 2; ++ch) stacked[(2 * j + 1) * 2 + ch] = 1.0f + 0.5f * stacked[(2 * j + 1) * 2 + ch];
  std::vector<float> ds(12, NAN);
  kc::batch_norm_combine_backward(c, 3, 2, counts.data(), stacked.data(), rs.data(), ds.data());
  CHECK(fd_ok(stacked, ds, [&](const V& v) { return test::dot(ref_combine(2, counts, v), rs); }, "combine dstats"));

  std::vector<float> ax(s.size(), NAN), as(2 * s.C, NAN), ag(s.C, NAN), ab(s.C, NAN);
  kc::batch_norm_apply_backward(c, s.N, s.C, s.HW, x.data(), r.data(), st.data(), g.data(), kEps, ax.data(),
                                as.data(), ag.data(), ab.data());
  const V sd = test::to_double(st);
  CHECK(fd_ok(x, ax, [&](const V& v) { return test::dot(ref_apply(s, v, sd, gd, bd), r); }, "apply dx"));
  CHECK(fd_ok(st, as, [&](const V& v) { return test::dot(ref_apply(s, xd, v, gd, bd), r); }, "apply dstats"));
  CHECK(fd_ok(g, ag, [&](const V& v) { return test::dot(ref_apply(s, xd, sd, v, bd), r); }, "apply dgamma"));
  CHECK(fd_ok(b, ab, [&](const V& v) { return test::dot(ref_apply(s, xd, sd, gd, v), r); }, "apply dbeta"));
}

namespace {
Tensor project(const Tensor& y, uint32_t seed = 77) {
  return sum(mul(y, Tensor::from_vector(lcg_data(y.numel(), seed), y.shape(), y.device())));
}
std::vector<float> positive_stats(int64_t K, int64_t C, uint32_t seed) {  // (2K, C), variances in [0.5, 1.5)
  auto v = lcg_data(2 * K * C, seed);
  for (int64_t j = 0; j < K; ++j)
    for (int64_t ch = 0; ch < C; ++ch) v[(2 * j + 1) * C + ch] = 1.0f + 0.5f * v[(2 * j + 1) * C + ch];
  return v;
}
// sync_batch_norm of x (5, 2, 2, 3) split 3/2 over cpu(0) and cpu(1), projected, summed on cpu(0).
Tensor sync_on_two(const std::vector<Tensor>& in) {
  std::vector<Device> devs{cpu(0), cpu(1)};
  auto parts = split(in[0], {3, 2});
  std::vector<Tensor> xs, g, b, rm, rv;
  for (int j = 0; j < 2; ++j) {
    xs.push_back(parts[j].to(devs[j]));
    g.push_back(in[1].to(devs[j]));
    b.push_back(in[2].to(devs[j]));
    rm.push_back(Tensor::zeros({2}, devs[j]));
    rv.push_back(Tensor::ones({2}, devs[j]));
  }
  auto ys = sync_batch_norm(xs, g, b, rm, rv);
  return project(ys[0], 5) + project(ys[1], 6).to(cpu(0));
}
struct OpCase {
  const char* name;  // the node whose backward the mutation breaks
  std::vector<test::GradSpec> inputs;
  std::function<Tensor(const std::vector<Tensor>&)> f;
};
std::vector<OpCase> op_cases() {
  return {
      {"batch_norm_stats", {{{4, 3, 2, 2}, shifted(48, 40, 1.0f, 2.0f)}},
       [](auto& x) { return project(batch_norm_stats(x[0])); }},
      {"batch_norm_combine_stats", {{{6, 2}, positive_stats(3, 2, 41)}},
       [](auto& x) { return project(batch_norm_combine_stats(x[0], {7, 2, 12})); }},
      {"batch_norm_apply",
       {{{3, 2, 2, 2}, lcg_data(24, 42)}, {{2, 2}, positive_stats(1, 2, 43)}, {{2}, {0.5f, 1.5f}}, {{2}, {0.1f, -0.2f}}},
       [](auto& x) { return project(batch_norm_apply(x[0], x[1], x[2], x[3])); }},
      {"batch_norm_apply",
       {{{5, 2, 2, 3}, shifted(60, 44, 0.5f, 1.5f)}, {{2}, {0.5f, 1.5f}}, {{2}, {0.1f, -0.2f}}}, sync_on_two},
  };
}
}  // namespace

TEST_CASE("the sync batch-norm ops through autograd match central finite differences; a broken backward fails") {
  use_devices({cpu(0), cpu(1)});
  for (auto& c : op_cases()) {
    CAPTURE(c.name);
    CHECK(test::gradcheck(c.f, c.inputs, cpu(0)));
    CHECK_FALSE(test::gradcheck_broken(c.name, c.f, c.inputs, cpu(0)));
  }
}

namespace {

// One training step of SyncBatchNorm on shards (rows[j] on devs[j]) against batch_norm on the
// concatenated batch on cpu(0) (the reference's gamma, beta and running statistics persist in `ref`).
struct Whole {
  Tensor gamma, beta, rm, rv;
};
void check_step(nn::SyncBatchNorm& net, Whole& ref, const std::vector<Device>& devs, const std::vector<int64_t>& rows,
                const Shape& tail, uint32_t seed) {
  const int64_t per_row = numel(tail), C = tail[0];
  std::vector<float> all, r_all;
  std::vector<Tensor> xs;
  for (size_t j = 0; j < devs.size(); ++j) {
    // Each shard its own offset and scale, so per-device statistics differ from the whole batch's.
    auto x = shifted(rows[j] * per_row, seed + uint32_t(j), 1.5f * float(j), 1.0f + 0.5f * float(j));
    Shape s = tail;
    s.insert(s.begin(), rows[j]);
    // (An empty shard is made, not copied from the host: a copy of 0 bytes passes memcpy a null pointer.)
    xs.push_back((x.empty() ? Tensor::zeros(s, devs[j]) : Tensor::from_vector(x, s, devs[j])).attach_grad());
    all.insert(all.end(), x.begin(), x.end());
  }
  r_all = lcg_data(int64_t(all.size()), seed + 100);
  net.collect_params().zero_grad();
  auto ys = net(xs);
  REQUIRE(ys.size() == devs.size());
  int64_t at = 0;
  std::vector<float> y_got;
  for (size_t j = 0; j < devs.size(); ++j) {  // the book: one backward per device loss
    CHECK(ys[j].device() == devs[j]);
    const int64_t n = ys[j].numel();
    CHECK(ys[j].shape() == xs[j].shape());
    if (n > 0) {
      auto y = ys[j].to_vector();
      y_got.insert(y_got.end(), y.begin(), y.end());
      std::vector<float> r(r_all.begin() + at, r_all.begin() + at + n);
      sum(mul(ys[j], Tensor::from_vector(r, ys[j].shape(), devs[j]))).backward();
    }
    at += n;
  }

  Shape whole = tail;
  whole.insert(whole.begin(), int64_t(all.size()) / per_row);
  Tensor x = Tensor::from_vector(all, whole, cpu(0)).attach_grad();
  ref.gamma.zero_grad(), ref.beta.zero_grad();
  Tensor y = batch_norm(x, ref.gamma, ref.beta, ref.rm, ref.rv, net.momentum, net.eps);
  sum(mul(y, Tensor::from_vector(r_all, whole, cpu(0)))).backward();

  CHECK(close(y.to_vector(), y_got, 1e-5, 1e-5, "y"));
  const auto gx = x.grad().to_vector();
  at = 0;
  for (size_t j = 0; j < devs.size(); ++j) {
    const int64_t n = xs[j].numel();
    if (n > 0) CHECK(close(std::vector<float>(gx.begin() + at, gx.begin() + at + n), xs[j].grad().to_vector(), 1e-5, 1e-5, "dx"));
    at += n;
  }
  std::vector<double> dg(C, 0.0), db(C, 0.0);
  for (Device d : devs) {
    auto g = net.weight->grad(d).to_vector(), b = net.bias->grad(d).to_vector();
    for (int64_t c = 0; c < C; ++c) dg[c] += g[c], db[c] += b[c];
    CHECK(close(ref.rm.to_vector(), net.running_mean->data(d).to_vector(), 1e-5, 1e-5, "running_mean"));
    CHECK(close(ref.rv.to_vector(), net.running_var->data(d).to_vector(), 1e-5, 1e-5, "running_var"));
  }
  CHECK(close(ref.gamma.grad().to_vector(), dg, 1e-5, 1e-5, "dgamma (sum of replicas)"));
  CHECK(close(ref.beta.grad().to_vector(), db, 1e-5, 1e-5, "dbeta (sum of replicas)"));
}

// Two training steps on `devs` (running statistics accumulate), gamma and beta not 1 and 0.
void check_against_whole_batch(const std::vector<Device>& devs, const std::vector<int64_t>& rows, const Shape& tail) {
  use_devices(devs);
  const int64_t C = tail[0];
  nn::SyncBatchNorm net(C);
  net.initialize(Init::One(), devs);
  const auto g = gamma_of(C), b = lcg_data(C, 12);
  net.weight->set_data(Tensor::from_vector(g, {C}, cpu(0)));
  net.bias->set_data(Tensor::from_vector(b, {C}, cpu(0)));
  Whole ref{Tensor::from_vector(g, {C}, cpu(0)).attach_grad(), Tensor::from_vector(b, {C}, cpu(0)).attach_grad(),
            Tensor::zeros({C}, cpu(0)), Tensor::ones({C}, cpu(0))};
  for (uint32_t step = 0; step < 2; ++step) {
    CAPTURE(step);
    check_step(net, ref, devs, rows, tail, 50 + 10 * step);
  }
}

}  // namespace

TEST_CASE("SyncBatchNorm on 2 and 3 CPU devices equals batch_norm on the whole batch") {
  const std::vector<Device> two{cpu(0), cpu(1)}, three{cpu(0), cpu(1), cpu(2)};
  SUBCASE("(N, C, H, W), shards 5/4") { check_against_whole_batch(two, {5, 4}, {3, 4, 5}); }
  SUBCASE("(N, C, H, W), shards 5/4/3") { check_against_whole_batch(three, {5, 4, 3}, {3, 4, 5}); }
  SUBCASE("(N, C), shards 5/4/3") { check_against_whole_batch(three, {5, 4, 3}, {6}); }
  SUBCASE("(N, C), shards 2/1") { check_against_whole_batch(two, {2, 1}, {4}); }
  SUBCASE("an empty shard: 4/0/3") { check_against_whole_batch(three, {4, 0, 3}, {2, 3, 3}); }
  SUBCASE("the first shard empty: 0/1 (N, C, H, W) with 2 values a channel") {
    check_against_whole_batch(two, {0, 1}, {3, 1, 2});
  }
  SUBCASE("one device: forward_shards of one shard") { check_against_whole_batch({cpu(0)}, {6}, {3, 2, 2}); }
}

TEST_CASE("SyncBatchNorm on emulated GPUs [emu(0), emu(1)] equals batch_norm on the whole batch") {
  const std::vector<Device> emus{emu(0), emu(1)};
  SUBCASE("(N, C, H, W), shards 3/2") { check_against_whole_batch(emus, {3, 2}, {2, 3, 2}); }
  SUBCASE("(N, C), shards 3/2") { check_against_whole_batch(emus, {3, 2}, {3}); }
}

TEST_CASE("per-device BatchNorm differs from the whole batch's (what SyncBatchNorm corrects)") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  use_devices(devs);
  nn::BatchNorm per_device(3);
  nn::SyncBatchNorm synced(3);
  per_device.initialize(Init::One(), devs);
  synced.initialize(Init::One(), devs);
  std::vector<Tensor> xs{Tensor::from_vector(shifted(5 * 3 * 4, 60, 0.0f, 1.0f), {5, 3, 2, 2}, cpu(0)),
                         Tensor::from_vector(shifted(4 * 3 * 4, 61, 1.5f, 1.5f), {4, 3, 2, 2}, cpu(1))};
  auto a = per_device(xs), b = synced(xs);
  double diff = 0;
  for (int j = 0; j < 2; ++j) {
    auto va = a[j].to_vector(), vb = b[j].to_vector();
    for (size_t i = 0; i < va.size(); ++i) diff = std::max(diff, double(std::fabs(va[i] - vb[i])));
  }
  CHECK(diff > 0.5);  // shards centred 1.5 apart: each normalised around its own mean instead
  CHECK(per_device.running_mean->data(cpu(0)).to_vector() != per_device.running_mean->data(cpu(1)).to_vector());
  CHECK(synced.running_mean->data(cpu(0)).to_vector() == synced.running_mean->data(cpu(1)).to_vector());
}

TEST_CASE("SyncBatchNorm: evaluation uses each device's running statistics; names as BatchNorm; clear errors") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  use_devices(devs);
  auto net = std::make_shared<nn::SyncBatchNorm>();
  net->initialize(Init::One(), devs);
  std::vector<Tensor> xs{Tensor::from_vector(shifted(4 * 2, 70, 2.0f, 1.0f), {4, 2}, cpu(0)),
                         Tensor::from_vector(shifted(3 * 2, 71, -1.0f, 2.0f), {3, 2}, cpu(1))};
  (*net)(xs);  // a training step infers C = 2 and moves the running statistics
  CHECK(net->describe() == "SyncBatchNorm(axis=1, eps=1e-05, momentum=0.1, in_channels=2)");
  std::vector<std::string> names;
  for (auto& [n, p] : net->collect_params()) names.push_back(n);
  CHECK(names == std::vector<std::string>{"weight", "bias", "running_mean", "running_var"});

  // Give cpu(1)'s replica other statistics: evaluation must use each device's own, unchanged.
  fill_(net->running_mean->data(cpu(1)), 0.25f);
  fill_(net->running_var->data(cpu(1)), 4.0f);
  const auto rm0 = net->running_mean->data(cpu(0)).to_vector(), rv0 = net->running_var->data(cpu(0)).to_vector();
  std::vector<Tensor> ys;
  {
    TrainMode eval(false);
    ys = (*net)(xs);
  }
  for (int j = 0; j < 2; ++j) {
    const Device d = devs[j];
    const auto x = xs[j].to_vector(), rm = net->running_mean->data(d).to_vector(), rv = net->running_var->data(d).to_vector();
    V want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = (x[i] - rm[i % 2]) / std::sqrt(double(rv[i % 2]) + kEps);
    CHECK(close(want, ys[j].to_vector(), 1e-5, 1e-5, "eval y"));
  }
  CHECK(net->running_mean->data(cpu(0)).to_vector() == rm0);
  CHECK(net->running_var->data(cpu(0)).to_vector() == rv0);
  CHECK(net->running_mean->data(cpu(1)).to_vector() == std::vector<float>{0.25f, 0.25f});

  // Training with one value per channel in all: the statistics are undefined.
  std::vector<Tensor> one{Tensor::ones({1, 2}, cpu(0)), Tensor::ones({0, 2}, cpu(1))};
  CHECK_THROWS_WITH_AS((*net)(one), doctest::Contains("more than one value per channel over all shards, got 1"), ShapeError);
  CHECK_THROWS_AS(net->forward(Tensor::ones({1, 2, 1, 1}, cpu(0))), ShapeError);
  {
    TrainMode eval(false);  // evaluation of one value is fine
    CHECK(net->forward(Tensor::ones({1, 2}, cpu(0))).shape() == Shape{1, 2});
  }
  CHECK_THROWS_WITH_AS((*net)({Tensor::ones({2, 3}, cpu(0))}), doctest::Contains("SyncBatchNorm"), ShapeError);
  CHECK_THROWS_AS(sync_batch_norm({Tensor::ones({2, 2}, cpu(0)), Tensor::ones({2, 2, 1, 1}, cpu(1))},
                                  {Tensor::ones({2}, cpu(0)), Tensor::ones({2}, cpu(1))},
                                  {Tensor::ones({2}, cpu(0)), Tensor::ones({2}, cpu(1))},
                                  {Tensor::ones({2}, cpu(0)), Tensor::ones({2}, cpu(1))},
                                  {Tensor::ones({2}, cpu(0)), Tensor::ones({2}, cpu(1))}),
                  ShapeError);
}

TEST_CASE("Sequential passes the shards to SyncBatchNorm together") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  use_devices(devs);
  auto bn = std::make_shared<nn::SyncBatchNorm>();
  nn::Sequential net;
  net.add(bn);
  net.initialize(Init::One(), devs);
  std::vector<Tensor> xs{Tensor::from_vector(shifted(6, 80, 0.0f, 1.0f), {3, 2}, cpu(0)),
                         Tensor::from_vector(shifted(6, 81, 3.0f, 1.0f), {3, 2}, cpu(1))};
  auto ys = net(xs);
  // The whole batch is normalised: per channel, the outputs of both shards sum to ~0.
  auto a = ys[0].to_vector(), b = ys[1].to_vector();
  for (int c = 0; c < 2; ++c) CHECK(std::fabs(a[c] + a[2 + c] + a[4 + c] + b[c] + b[2 + c] + b[4 + c]) < 1e-5);
  CHECK(bn->running_mean->data(cpu(0)).to_vector() == bn->running_mean->data(cpu(1)).to_vector());
}
