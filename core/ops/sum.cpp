// sum and mean of all elements, and the reduction the losses share (kernels/{cpu,cuda}/sum).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernel (kernels/cpu/sum.cpp, kernels/cuda/sum.cu): out[0] = sum of x (double accumulation, in a
// fixed order: the same bits for any thread count).
D2L_DECLARE_KERNEL(sum, const float* x, float* out, int64_t n);

namespace d2l {
using namespace detail;

Tensor sum(const Tensor& x_in) {
  const Tensor x = autocast_input("sum", x_in);
  Device d = same_device("sum", {x});
  expect_f32("sum", x, "x");
  Tensor y = Tensor::empty({1}, d);
  const float* X = x.data();
  float* Y = y.data();
  int64_t n = x.numel();
  launch(d, "sum", keep({x, y}), [=](const LaunchCtx& c) { D2L_KERNEL(c, sum, X, Y, n); });
  Shape shape = x.shape();
  record(y, "sum", {x}, [shape, n](const Tensor& gy) {
    // d sum / d x_i = 1: every element gets grad_out. grad_out stays in device memory (a GPU's is not
    // readable by the host), so gx = 0 + grad_out broadcast, as a bias add with one channel.
    Tensor gx = Tensor::empty(shape, gy.device());
    const float* G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), "sum_backward", keep({gy, gx}), [=](const LaunchCtx& c) {
      D2L_KERNEL(c, fill, GX, n, 0.0f);
      D2L_KERNEL(c, bias_add_forward, GX, G, GX, n, 1, 1);
    });
    return std::vector<Tensor>{gx};
  });
  return y;
}

Tensor mean(const Tensor& x) { return scale(sum(x), 1.0f / static_cast<float>(std::max<int64_t>(1, x.numel()))); }

Tensor detail::reduce_loss(const Tensor& per_sample, Reduction r) {
  if (r == Reduction::none) return per_sample;
  return r == Reduction::sum ? sum(per_sample) : mean(per_sample);
}

}  // namespace d2l
