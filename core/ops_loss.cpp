// sum, mean, softmax cross-entropy, squared loss, argmax and the accuracy count.
#include "core/ops.hpp"
#include "core/ops_util.hpp"

namespace d2l {
using namespace detail;

Tensor sum(const Tensor& x) {
  Device d = same_device("sum", {x});
  expect_f32("sum", x, "x");
  Tensor y = Tensor::empty({1}, d);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "sum", keep({x, y}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, sum, X, Y, n); });
  Shape shape = x.shape();
  record(y, "sum", {x}, [shape, n](const Tensor& gy) {
    // d sum / d x_i = 1: every element gets grad_out. grad_out stays in device memory (a GPU's is not
    // readable by the host), so gx = 0 + grad_out broadcast, as a bias add with one channel.
    Tensor gx = Tensor::empty(shape, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "sum_backward", keep({gy, gx}), [=](const kernels::cpu::Ctx& c) {
      D2L_KERNEL(c, fill, GX, n, 0.0f);
      D2L_KERNEL(c, bias_add_forward, GX, G, GX, n, 1, 1);
    });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor mean(const Tensor& x) { return scale(sum(x), 1.0f / static_cast<float>(std::max<int64_t>(1, x.numel()))); }

static Tensor reduce(const Tensor& per_sample, Reduction r) {
  if (r == Reduction::none) return per_sample;
  return r == Reduction::sum ? sum(per_sample) : mean(per_sample);
}

Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction r) {
  Device d = same_device("softmax_cross_entropy", {logits, labels});
  expect_f32("softmax_cross_entropy", logits, "logits");
  expect_ndim("softmax_cross_entropy", logits, 2, "logits");
  if (labels.dtype() != DType::i32 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0))
    fail("softmax_cross_entropy", "labels must be int32 (N) for logits " + str(logits.shape()) + ", got " +
                                      str(labels.shape()));
  int64_t N = logits.dim(0), K = logits.dim(1);
  Tensor loss = Tensor::empty({N}, d);
  const float* L = logits.data();
  const int32_t* Y = labels.labels();
  float* out = loss.data();
  launch(d, "softmax_cross_entropy", keep({logits, labels, loss}), [=](const kernels::cpu::Ctx& c) {
    // Labels in host memory (cpu, emu) are checked here; a GPU's are checked where they were made
    // (the data pipeline builds them on the host).
    for (int64_t i = 0; !c.cuda_stream && i < N; ++i)
      if (Y[i] < 0 || Y[i] >= K) throw std::out_of_range("label " + std::to_string(Y[i]) + " outside [0, " + std::to_string(K) + ")");
    D2L_KERNEL(c, softmax_ce_forward, L, Y, out, N, K);
  });
  record(loss, "softmax_cross_entropy", {logits, labels}, [logits, labels, N, K](const Tensor& gy) {
    Tensor gx = Tensor::empty(logits.shape(), logits.device());
    const float *L = logits.data(), *G = gy.data();
    const int32_t* Y = labels.labels();
    float* GX = gx.data();
    launch(logits.device(), "softmax_cross_entropy_backward", keep({logits, labels, gy, gx}),
           [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, softmax_ce_backward, L, Y, G, GX, N, K); });
    return std::vector<Tensor>{gx, Tensor()};
  });
  return reduce(loss, r);
}

Tensor mse_loss(const Tensor& p, const Tensor& t, Reduction r) {
  Device d = same_device("mse_loss", {p, t});
  expect_f32("mse_loss", p, "prediction");
  expect_f32("mse_loss", t, "target");
  if (p.shape() != t.shape()) fail("mse_loss", "prediction " + str(p.shape()) + " and target " + str(t.shape()) + " differ");
  Tensor l = Tensor::empty(p.shape(), d);
  const float *P = p.data(), *T = t.data();
  float* out = l.data();
  int64_t n = p.numel();
  launch(d, "mse_loss", keep({p, t, l}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, mse_forward, P, T, out, n); });
  record(l, "mse_loss", {p, t}, [p, t, n](const Tensor& gy) {
    Tensor gp = Tensor::empty(p.shape(), p.device());
    const float *P = p.data(), *T = t.data(), *G = gy.data();
    float* GP = gp.data();
    launch(p.device(), "mse_loss_backward", keep({p, t, gy, gp}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, mse_backward, P, T, G, GP, n); });
    return std::vector<Tensor>{gp, scale(gp, -1.0f)};  // d/dt = -(p - t) * gy
  });
  return reduce(l, r);
}

Tensor argmax(const Tensor& x) {
  Device d = same_device("argmax", {x});
  expect_f32("argmax", x, "x");
  expect_ndim("argmax", x, 2, "x");
  int64_t N = x.dim(0), K = x.dim(1);
  Tensor idx = Tensor::empty({N}, d, DType::i32);
  const float* X = x.data();
  int32_t* I = idx.labels();
  launch(d, "argmax", keep({x, idx}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, argmax, X, I, N, K); });
  return idx;
}

Tensor count_correct(const Tensor& logits, const Tensor& labels) {
  Device d = same_device("count_correct", {logits, labels});
  expect_ndim("count_correct", logits, 2, "logits");
  if (labels.dtype() != DType::i32 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0))
    fail("count_correct", "labels must be int32 (N) for logits " + str(logits.shape()));
  int64_t N = logits.dim(0), K = logits.dim(1);
  Tensor out = Tensor::empty({1}, d);
  const float* X = logits.data();
  const int32_t* Y = labels.labels();
  float* O = out.data();
  launch(d, "count_correct", keep({logits, labels, out}), [=](const kernels::cpu::Ctx& c) { D2L_KERNEL(c, count_correct, X, Y, O, N, K); });
  return out;
}

}  // namespace d2l
