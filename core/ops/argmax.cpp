// argmax per row and count_correct, the accuracy's numerator (kernels/{cpu,cuda}/argmax).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels (kernels/cpu/argmax.cpp, kernels/cuda/argmax.cu): x (N, K) -> idx (N) int32, the first
// index of each row's maximum; correct[0] = #{i : argmax(x[i]) == labels[i]}.
D2L_DECLARE_KERNEL(argmax, const float* x, int32_t* idx, int64_t N, int64_t K);
D2L_DECLARE_KERNEL(count_correct, const float* x, const int32_t* labels, float* correct, int64_t N, int64_t K);

namespace d2l {
using namespace detail;

// A 16-bit x (the logits of a forward under autocast, whose dense layer runs in its input's type on
// CPU devices) is widened first, inside a scope or not: widening is exact, and neither op has a
// gradient, so the maximum is the 16-bit values' own.
static Tensor widened(const Tensor& x) { return x.defined() && is_float(x.dtype()) ? cast(x, DType::f32) : x; }

Tensor argmax(const Tensor& x_in) {
  const Tensor x = widened(autocast_input("argmax", x_in));
  Device d = same_device("argmax", {x});
  expect_f32("argmax", x, "x");
  expect_ndim("argmax", x, 2, "x");
  int64_t N = x.dim(0), K = x.dim(1);
  Tensor idx = Tensor::empty({N}, d, DType::i32);
  const float* X = x.data();
  int32_t* I = idx.labels();
  launch(d, "argmax", keep({x, idx}), [=](const LaunchCtx& c) { D2L_KERNEL(c, argmax, X, I, N, K); });
  return idx;
}

Tensor count_correct(const Tensor& logits_in, const Tensor& labels) {
  const Tensor logits = widened(autocast_input("count_correct", logits_in));
  Device d = same_device("count_correct", {logits, labels});
  expect_ndim("count_correct", logits, 2, "logits");
  if (labels.dtype() != DType::i32 || labels.ndim() != 1 || labels.dim(0) != logits.dim(0))
    fail("count_correct", "labels must be int32 (N) for logits " + str(logits.shape()));
  int64_t N = logits.dim(0), K = logits.dim(1);
  Tensor out = Tensor::empty({1}, d);
  const float* X = logits.data();
  const int32_t* Y = labels.labels();
  float* O = out.data();
  launch(d, "count_correct", keep({logits, labels, out}), [=](const LaunchCtx& c) { D2L_KERNEL(c, count_correct, X, Y, O, N, K); });
  return out;
}

}  // namespace d2l
