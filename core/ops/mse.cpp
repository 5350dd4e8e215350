// mse_loss: d2l's squared loss (p - t)^2 / 2 (kernels/{cpu,cuda}/mse).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/mse.cpp, kernels/cuda/mse.cu), over flat arrays of n:
// Per element, d2l's squared_loss: l = (p - t)^2 / 2; dp = dl * (p - t).
D2L_DECLARE_KERNEL(mse_forward, const float* p, const float* t, float* l, int64_t n);
D2L_DECLARE_KERNEL(mse_backward, const float* p, const float* t, const float* dl, float* dp, int64_t n);

namespace d2l {
using namespace detail;

Tensor mse_loss(const Tensor& p_in, const Tensor& t_in, Reduction r) {
  const Tensor p = autocast_input("mse_loss", p_in);
  const Tensor t = autocast_input("mse_loss", t_in);
  Device d = same_device("mse_loss", {p, t});
  expect_f32("mse_loss", p, "prediction");
  expect_f32("mse_loss", t, "target");
  if (p.shape() != t.shape()) fail("mse_loss", "prediction " + str(p.shape()) + " and target " + str(t.shape()) + " differ");
  Tensor l = Tensor::empty(p.shape(), d);
  const float *P = p.data(), *T = t.data();
  float* out = l.data();
  int64_t n = p.numel();
  launch(d, "mse_loss", keep({p, t, l}), [=](const LaunchCtx& c) { D2L_KERNEL(c, mse_forward, P, T, out, n); });
  record(l, "mse_loss", {p, t}, [p, t, n](const Tensor& gy) {
    Tensor gp = Tensor::empty(p.shape(), p.device());
    const float *P = p.data(), *T = t.data(), *G = gy.data();
    float* GP = gp.data();
    launch(p.device(), "mse_loss_backward", keep({p, t, gy, gp}), [=](const LaunchCtx& c) { D2L_KERNEL(c, mse_backward, P, T, G, GP, n); });
    return std::vector<Tensor>{gp, scale(gp, -1.0f)};  // d/dt = -(p - t) * gy
  });
  return reduce_loss(l, r);
}

}  // namespace d2l
