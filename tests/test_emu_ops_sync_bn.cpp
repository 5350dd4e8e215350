// Emulated batch_norm_stats kernels (SyncBatchNorm's pieces) against their kernels/cpu twins, and
// every emulated backward against central finite differences of the emulated forward (a gradient
// x1.05 must fail the same check). Tolerances (d2l::test::close, |ref - x| <= atol + rtol |ref|):
//   1e-6/1e-6   statistics, combine and running statistics (double sums, another order)
//   1e-5/1e-5   y and the backward passes (float arithmetic on those)
//   FD          atol 1e-3, rtol 1e-2 (test_emu_ops.hpp); h 5e-2 where the map is linear, 1e-2 else
#include <vector>

#include "test_emu_ops.hpp"

using namespace emu_ops;

namespace {

struct Sh {
  int64_t N, C, HW;
  int64_t size() const { return N * C * HW; }
};
// M = N*HW per channel from 2 to 300 (more than one 256-thread block's stride); dense layers (HW = 1).
const Sh kShapes[] = {{4, 3, 5}, {2, 1, 1}, {64, 4, 1}, {3, 2, 100}};
constexpr float kEps = 1e-5f;

std::vector<float> gamma_of(int64_t C) {
  auto g = lcg_data(C, 162);
  for (float& v : g) v += 1.5f;  // in [0.5, 2.5)
  return g;
}
// K shards' statistics (K, 2, C): means in [-1, 1), variances in [0.5, 1.5).
std::vector<float> stacked_stats(int64_t K, int64_t C, uint32_t seed) {
  auto v = lcg_data(2 * K * C, seed);
  for (int64_t j = 0; j < K; ++j)
    for (int64_t c = 0; c < C; ++c) v[(2 * j + 1) * C + c] = 1.0f + 0.5f * v[(2 * j + 1) * C + c];
  return v;
}

void check_sync_bn(kemu::Stream st) {
  for (const Sh& s : kShapes) {
    INFO("N" << s.N << " C" << s.C << " HW" << s.HW);
    const int64_t n = s.size();
    auto x = lcg_data(n, 163);
    for (float& v : x) v = 2.0f + 3.0f * v;  // mean away from 0
    const auto dy = lcg_data(n, 164), g = gamma_of(s.C), b = lcg_data(s.C, 165), ds = lcg_data(2 * s.C, 166);

    std::vector<float> se(2 * s.C, NAN), sc(2 * s.C, NAN);
    kemu::batch_norm_stats_forward(st, s.N, s.C, s.HW, x.data(), se.data());
    cpu::batch_norm_stats_forward(kSerial, s.N, s.C, s.HW, x.data(), sc.data());
    CHECK(close(sc, se, 1e-6, 1e-6, "stats"));
    std::vector<float> dxe(n, NAN), dxc(n, NAN);
    kemu::batch_norm_stats_backward(st, s.N, s.C, s.HW, x.data(), sc.data(), ds.data(), dxe.data());
    cpu::batch_norm_stats_backward(kSerial, s.N, s.C, s.HW, x.data(), sc.data(), ds.data(), dxc.data());
    CHECK(close(dxc, dxe, 1e-5, 1e-5, "stats dx"));

    std::vector<float> ye(n, NAN), yc(n, NAN);
    kemu::batch_norm_apply_forward(st, s.N, s.C, s.HW, x.data(), sc.data(), g.data(), b.data(), kEps, ye.data());
    cpu::batch_norm_apply_forward(kSerial, s.N, s.C, s.HW, x.data(), sc.data(), g.data(), b.data(), kEps, yc.data());
    CHECK(close(yc, ye, 1e-5, 1e-5, "apply y"));
    std::vector<float> ae(n, NAN), ac(n, NAN), ase(2 * s.C, NAN), asc(2 * s.C, NAN);
    std::vector<float> age(s.C, NAN), agc(s.C, NAN), abe(s.C, NAN), abc(s.C, NAN);
    kemu::batch_norm_apply_backward(st, s.N, s.C, s.HW, x.data(), dy.data(), sc.data(), g.data(), kEps, ae.data(),
                                    ase.data(), age.data(), abe.data());
    cpu::batch_norm_apply_backward(kSerial, s.N, s.C, s.HW, x.data(), dy.data(), sc.data(), g.data(), kEps,
                                   ac.data(), asc.data(), agc.data(), abc.data());
    CHECK(close(ac, ae, 1e-5, 1e-5, "apply dx"));
    CHECK(close(asc, ase, 1e-5, 1e-5, "apply dstats"));
    CHECK(close(agc, age, 1e-5, 1e-5, "apply dgamma"));
    CHECK(close(abc, abe, 1e-5, 1e-5, "apply dbeta"));

    std::vector<float> rme = lcg_data(s.C, 167), rve(s.C, 1.5f), rmc = rme, rvc = rve;
    kemu::batch_norm_update_running(st, s.C, s.N * s.HW, sc.data(), 0.1f, rme.data(), rve.data());
    cpu::batch_norm_update_running(kSerial, s.C, s.N * s.HW, sc.data(), 0.1f, rmc.data(), rvc.data());
    CHECK(close(rmc, rme, 1e-6, 1e-6, "running_mean"));
    CHECK(close(rvc, rve, 1e-6, 1e-6, "running_var"));
  }
  // combine: 3 shards, C = 5 (and C = 300: more channels than one block's threads)
  for (int64_t C : {5, 300}) {
    INFO("combine C" << C);
    const std::vector<int32_t> counts{7, 1, 30};
    const auto stacked = stacked_stats(3, C, 168), dout = lcg_data(2 * C, 169);
    std::vector<float> oe(2 * C, NAN), oc(2 * C, NAN), de(6 * C, NAN), dc(6 * C, NAN);
    kemu::batch_norm_combine_forward(st, 3, C, counts.data(), stacked.data(), oe.data());
    cpu::batch_norm_combine_forward(kSerial, 3, C, counts.data(), stacked.data(), oc.data());
    CHECK(close(oc, oe, 1e-6, 1e-6, "combine"));
    kemu::batch_norm_combine_backward(st, 3, C, counts.data(), stacked.data(), dout.data(), de.data());
    cpu::batch_norm_combine_backward(kSerial, 3, C, counts.data(), stacked.data(), dout.data(), dc.data());
    CHECK(close(dc, de, 1e-6, 1e-6, "combine dstats"));
  }
}

}  // namespace

TEST_CASE("emulated batch_norm_stats kernels (SyncBatchNorm) match the CPU") { check_sync_bn(nullptr); }

TEST_CASE("emulated batch_norm_stats backward passes match finite differences") {
  const Sh s{3, 2, 5};
  const int64_t n = s.size();
  const auto x = lcg_data(n, 170), r = lcg_data(n, 171), rs = lcg_data(2 * s.C, 172), g = gamma_of(s.C),
             b = lcg_data(s.C, 173);
  auto stats_of = [&](const std::vector<float>& xf) {
    std::vector<float> st(2 * s.C);
    kemu::batch_norm_stats_forward(nullptr, s.N, s.C, s.HW, xf.data(), st.data());
    return st;
  };
  const auto st = stats_of(x);
  std::vector<float> dx(n);
  kemu::batch_norm_stats_backward(nullptr, s.N, s.C, s.HW, x.data(), st.data(), rs.data(), dx.data());
  CHECK(grad_check(x, dx, [&](const std::vector<double>& v) { return dot(to_double(stats_of(to_float(v))), rs); },
                   {1e-2}, "stats dx"));

  const std::vector<int32_t> counts{4, 9, 2};
  const auto stacked = stacked_stats(3, s.C, 174);
  std::vector<float> ds(6 * s.C);
  kemu::batch_norm_combine_backward(nullptr, 3, s.C, counts.data(), stacked.data(), rs.data(), ds.data());
  auto combine_loss = [&](const std::vector<double>& v) {
    const auto vf = to_float(v);
    std::vector<float> out(2 * s.C);
    kemu::batch_norm_combine_forward(nullptr, 3, s.C, counts.data(), vf.data(), out.data());
    return dot(to_double(out), rs);
  };
  CHECK(grad_check(stacked, ds, combine_loss, {1e-2}, "combine dstats"));

  // apply: y as a function of each input in turn, the others held at their values
  auto apply = [&](const std::vector<float>& xf, const std::vector<float>& sf, const std::vector<float>& gf,
                   const std::vector<float>& bf) {
    std::vector<float> y(n);
    kemu::batch_norm_apply_forward(nullptr, s.N, s.C, s.HW, xf.data(), sf.data(), gf.data(), bf.data(), kEps, y.data());
    return dot(to_double(y), r);
  };
  std::vector<float> ax(n), as(2 * s.C), ag(s.C), ab(s.C);
  kemu::batch_norm_apply_backward(nullptr, s.N, s.C, s.HW, x.data(), r.data(), st.data(), g.data(), kEps, ax.data(),
                                  as.data(), ag.data(), ab.data());
  using V = std::vector<double>;
  CHECK(grad_check(x, ax, [&](const V& v) { return apply(to_float(v), st, g, b); }, {5e-2}, "apply dx"));
  CHECK(grad_check(st, as, [&](const V& v) { return apply(x, to_float(v), g, b); }, {1e-2}, "apply dstats"));
  CHECK(grad_check(g, ag, [&](const V& v) { return apply(x, st, to_float(v), b); }, {5e-2}, "apply dgamma"));
  CHECK(grad_check(b, ab, [&](const V& v) { return apply(x, st, g, to_float(v)); }, {5e-2}, "apply dbeta"));
}

TEST_CASE("emulated batch_norm_stats kernels on 2 device threads" * doctest::test_suite("threads")) {
  TwoThreads two;
  check_sync_bn(&two.ctx);
}
