// fill_, scale and scale_ (kernels/{cpu,cuda}/fill), and the tensors made by a fill (Tensor::zeros,
// ones and full, core/tensor.hpp).
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor Tensor::zeros(const Shape& shape, Device d, DType t) {
  Tensor x = empty(shape, d, t);
  fill_(x, 0.0f);  // 0.0f and int32 0 share the bit pattern
  return x;
}

Tensor Tensor::ones(const Shape& shape, Device d) { return full(shape, 1.0f, d); }

Tensor Tensor::full(const Shape& shape, float value, Device d) {
  Tensor x = empty(shape, d);
  fill_(x, value);
  return x;
}

Tensor scale(const Tensor& x_in, float alpha) {
  const Tensor x = autocast_input("scale", x_in);
  Tensor y = elementwise_output("scale", {x});
  run("scale", {x, y}, [=, X = x.data(), Y = y.data(), n = x.numel()](const LaunchCtx& c) { D2L_KERNEL(c, scale, X, Y, n, alpha); });
  record(y, "scale", {x}, [alpha](const Tensor& gy) { return std::vector<Tensor>{scale(gy, alpha)}; });
  return y;
}

Tensor operator*(const Tensor& x, float alpha) { return scale(x, alpha); }

// ---- in place: never recorded; they change values a graph may have read, so use them for updates.
void fill_(const Tensor& x, float value) {
  same_device("fill", {x});
  float* X = static_cast<float*>(x.storage()->ptr);  // int32 zeros share 0.0f's bits
  run("fill", {x}, [=, n = x.numel()](const LaunchCtx& c) { D2L_KERNEL(c, fill, X, n, value); });
}

void scale_(const Tensor& x, float alpha) {
  check_elementwise("scale_", {x});
  run("scale_", {x}, [=, X = x.data(), n = x.numel()](const LaunchCtx& c) { D2L_KERNEL(c, scale, X, X, n, alpha); });
}

}  // namespace d2l
