// The checks every op shares (core/ops/op.hpp).
#include "core/ops/op.hpp"

namespace d2l::detail {

void fail(const char* op, const std::string& msg) { throw ShapeError(std::string(op) + ": " + msg); }

Device same_device(const char* op, const std::vector<Tensor>& ts) {
  Device d = ts.at(0).device();
  for (auto& t : ts) {
    if (!t.defined()) fail(op, "an input is undefined");
    if (t.device() != d)
      fail(op, "inputs live on " + d.str() + " and " + t.device().str() +
                   "; copy one with to() first (devices never mix implicitly)");
  }
  return d;
}

void expect_f32(const char* op, const Tensor& t, const char* what) {
  if (t.dtype() != DType::f32) fail(op, std::string(what) + " must be float32");
}

void expect_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) fail(op, "shapes differ: " + str(a.shape()) + " and " + str(b.shape()));
}

void expect_ndim(const char* op, const Tensor& t, int64_t n, const char* what) {
  if (t.ndim() != n)
    fail(op, std::string(what) + " must have " + std::to_string(n) + " dimensions, got shape " + str(t.shape()));
}

Device check_elementwise(const char* op, std::initializer_list<Tensor> inputs) {
  const Device d = same_device(op, inputs);
  const Tensor& first = *inputs.begin();
  for (const Tensor& t : inputs) {
    expect_f32(op, t, "every input");
    expect_same_shape(op, first, t);
  }
  return d;
}

Tensor elementwise_output(const char* op, std::initializer_list<Tensor> inputs) {
  const Device d = check_elementwise(op, inputs);
  return Tensor::empty(inputs.begin()->shape(), d);
}

}  // namespace d2l::detail
