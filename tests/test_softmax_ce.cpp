// softmax_ce on every backend: the CPU kernels (kernels/cpu/softmax_ce.cpp) against a double-precision
// reference, the backward against central finite differences; the emulated CUDA kernels
// (kernels/cuda/softmax_ce.cu) within 1e-6 of the CPU's (double sums in another order, rounded to float
// once), their backward against finite differences of the emulated forward; the op through autograd.
#include <doctest/doctest.h>

#include "core/ops/op.hpp"
#include "emu_check.hpp"
#include "kernel_check.hpp"

// logits (N, K), labels (N) int32 in [0, K). loss[i] = logsumexp(logits[i]) - logits[i][label[i]],
// per sample; dlogits[i][k] = dloss[i] * (softmax(logits[i])[k] - (k == label[i])).
D2L_DECLARE_KERNEL(softmax_ce_forward, const float* logits, const int32_t* labels, float* loss, int64_t N, int64_t K);
D2L_DECLARE_KERNEL(softmax_ce_backward, const float* logits, const int32_t* labels, const float* dloss, float* dlogits,
                   int64_t N, int64_t K);

using namespace d2l::test;

TEST_CASE("softmax_ce forward and backward") {
  Ctxs ctxs;
  for (NK s : {NK{1, 1}, NK{1, 7}, NK{7, 1}, NK{33, 10}, NK{5, 129}, NK{1037, 3}}) {
    Vec x = lcg_data(s.N * s.K, 61), dloss = lcg_data(s.N, 62);
    for (auto& v : x) v *= 4.0f;  // logits in [-4, 4)
    Labels labels = make_labels(s.N, s.K, 63);
    std::vector<double> ref(s.N), dref(s.N * s.K);
    for (int64_t i = 0; i < s.N; ++i) {
      const float* xi = x.data() + i * s.K;
      ref[i] = ref_ce(xi, s.K, labels[i]);
      double m = xi[0], z = 0;
      for (int64_t k = 0; k < s.K; ++k) m = std::fmax(m, double(xi[k]));
      for (int64_t k = 0; k < s.K; ++k) z += std::exp(double(xi[k]) - m);
      for (int64_t k = 0; k < s.K; ++k)  // softmax - one-hot, scaled by dloss
        dref[i * s.K + k] = dloss[i] * (std::exp(double(xi[k]) - m) / z - (k == labels[i] ? 1.0 : 0.0));
    }
    for (const auto& c : ctxs.list) {
      CAPTURE(c.threads);
      CAPTURE(s.N);
      CAPTURE(s.K);
      Vec loss(s.N), dx(s.N * s.K);
      cpu::softmax_ce_forward(c, x.data(), labels.data(), loss.data(), s.N, s.K);
      CHECK(close(ref, loss, 1e-6, 1e-6, "softmax_ce"));
      cpu::softmax_ce_backward(c, x.data(), labels.data(), dloss.data(), dx.data(), s.N, s.K);
      CHECK(close(dref, dx, 1e-7, 1e-6, "softmax_ce_backward"));
      if (s.N * s.K <= 700) CHECK(grad_ok(numeric_grad(x, ce_objective(labels, dloss, s.N, s.K)), dx));
    }
  }
}

TEST_CASE("softmax_ce is stable for huge logits") {
  const int64_t N = 3, K = 4;
  Vec x = {1000.0f, 999.0f, 998.0f, 990.0f, -1000.0f, -1001.0f, -999.0f, -1005.0f, 88.0f, 89.0f, 90.0f, 91.0f};
  Labels labels = {0, 3, 2};
  Vec loss(N), dx(N * K), dloss(N, 1.0f);
  cpu::softmax_ce_forward(cpu::serial_ctx(), x.data(), labels.data(), loss.data(), N, K);
  cpu::softmax_ce_backward(cpu::serial_ctx(), x.data(), labels.data(), dloss.data(), dx.data(), N, K);
  std::vector<double> ref(N);
  for (int64_t i = 0; i < N; ++i) ref[i] = ref_ce(x.data() + i * K, K, labels[i]);
  CHECK(close(ref, loss, 1e-6, 1e-6, "softmax_ce huge"));
  for (float v : dx) CHECK(std::isfinite(v));
  for (int64_t i = 0; i < N; ++i) {  // each row of the gradient sums to 0
    double s = 0;
    for (int64_t k = 0; k < K; ++k) s += dx[i * K + k];
    CHECK(std::fabs(s) < 1e-6);
  }
}

TEST_CASE("the gradient check rejects a wrong softmax_ce gradient") {
  const auto c = cpu::serial_ctx();
  const int64_t N = 33, K = 10;
  Vec x = lcg_data(N * K, 61), dloss = lcg_data(N, 62), dx(N * K);
  Labels labels = make_labels(N, K, 63);
  cpu::softmax_ce_backward(c, x.data(), labels.data(), dloss.data(), dx.data(), N, K);
  auto numeric = numeric_grad(x, ce_objective(labels, dloss, N, K));
  check_grad_and_control(numeric, dx);
}

// ---- the emulated CUDA kernels: within 1e-6 of the CPU's, on (N, K) with classes fewer than, equal to
// and more than a warp's 32 lanes.
namespace {
void check_emulated(kemu::Stream s) {
  for_row_shapes([&](const RowsShape& r) {
    auto logits = lcg_data(r.N * r.K, 9);
    for (float& v : logits) v *= 4.0f;
    const auto labels = labels_for(r.N, r.K, 10);
    const auto dloss = lcg_data(r.N, 11);
    Vec loss(r.N), loss_ref(r.N), dl(r.N * r.K), dl_ref(r.N * r.K);
    kemu::softmax_ce_forward(s, logits.data(), labels.data(), loss.data(), r.N, r.K);
    cpu::softmax_ce_forward(cpu::serial_ctx(), logits.data(), labels.data(), loss_ref.data(), r.N, r.K);
    CHECK(close(loss_ref, loss, 1e-6, 1e-6, "softmax_ce_forward"));
    kemu::softmax_ce_backward(s, logits.data(), labels.data(), dloss.data(), dl.data(), r.N, r.K);
    cpu::softmax_ce_backward(cpu::serial_ctx(), logits.data(), labels.data(), dloss.data(), dl_ref.data(), r.N, r.K);
    CHECK(close(dl_ref, dl, 1e-6, 1e-6, "softmax_ce_backward"));
  });
}
}  // namespace

D2L_EMULATED_CASES("emulated softmax_ce matches the CPU",
                   "emulated softmax_ce on 2 device threads", check_emulated)

TEST_CASE("emulated softmax_ce_backward matches finite differences") {
  for (const RowsShape& sh : {RowsShape{7, 10}, RowsShape{3, 33}, RowsShape{1, 1}}) {
    CAPTURE(sh.N);
    CAPTURE(sh.K);
    auto logits = lcg_data(sh.N * sh.K, 28);
    for (float& v : logits) v *= 3.0f;
    const auto labels = labels_for(sh.N, sh.K, 29);
    const auto r = lcg_data(sh.N, 30);
    Vec dl(sh.N * sh.K);
    kemu::softmax_ce_backward(nullptr, logits.data(), labels.data(), r.data(), dl.data(), sh.N, sh.K);
    auto loss = [&](const std::vector<double>& xd) {
      const auto xf = to_float(xd);
      Vec l(sh.N);
      kemu::softmax_ce_forward(nullptr, xf.data(), labels.data(), l.data(), sh.N, sh.K);
      return dot(to_double(l), r);
    };
    // K = 1: the loss is constantly 0, so is the gradient: nothing for a broken one to get wrong.
    // FD tolerances: FdTol's (emu_check.hpp).
    CHECK(grad_check(logits, dl, loss, {1e-2}, "softmax_ce dlogits", sh.K > 1));
  }
}

// ---- the op through autograd: gradcheck's tolerances (h 1e-2, atol 2e-3, rtol 2e-2), and a broken
// backward must fail.
TEST_CASE("softmax_cross_entropy's backward matches finite differences; a broken one fails") {
  const d2l::Device d = d2l::cpu(0);
  auto labels = [d] { return d2l::Tensor::from_vector(std::vector<int32_t>{2, 0, 4}, {3}, d); };
  CHECK(op_case_ok({"softmax_cross_entropy", {{{3, 5}, grad_input(15, 14)}},
                    [labels](auto& x) { return d2l::softmax_cross_entropy(x[0], labels(), d2l::Reduction::sum); }},
                   d));
}
