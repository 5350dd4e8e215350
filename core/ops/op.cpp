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

TensorLists tensor_lists(const char* op, std::initializer_list<const std::vector<Tensor>*> lists) {
  const std::vector<Tensor>& first = **lists.begin();
  for (const auto* list : lists)
    if (list->size() != first.size())
      fail(op, "the lists hold " + std::to_string(first.size()) + " and " + std::to_string(list->size()) + " tensors");
  TensorLists out{first.empty() ? Device{} : first[0].device(), {}, {}, {}};
  out.ptr.resize(lists.size());
  for (size_t t = 0; t < first.size(); ++t) {
    std::vector<Tensor> column;  // tensor t of every list
    for (const auto* list : lists) column.push_back((*list)[t]);
    if (same_device(op, column) != out.device)
      fail(op, "tensors live on " + out.device.str() + " and " + column[0].device().str() + "; one device a launch");
    for (const Tensor& x : column) {
      expect_f32(op, x, "every tensor");
      expect_same_shape(op, column[0], x);
    }
    for (size_t l = 0; l < column.size(); ++l) {
      out.ptr[l].push_back(column[l].data());
      out.keep.push_back(column[l].storage());
    }
    out.n.push_back(column[0].numel());
  }
  return out;
}

bool in_16_bits(const char* op, const Tensor& x) {
  if (x.dtype() == DType::f32) return false;
  if (!is_float(x.dtype())) fail(op, std::string("x must be a float tensor, not ") + dtype_name(x.dtype()));
  if (x.device().kind != DeviceKind::cpu)
    fail(op, std::string("a ") + dtype_name(x.dtype()) + " input runs on CPU devices only (" + x.device().str() +
                 "'s kernels are float32: cast it, or let Autocast do it)");
  return true;
}

kernels::cpu::Float16 float16_of(DType t) {
  return t == DType::bf16 ? kernels::cpu::Float16::bf16 : kernels::cpu::Float16::f16;
}

Tensor elementwise_output(const char* op, std::initializer_list<Tensor> inputs) {
  const Device d = check_elementwise(op, inputs);
  return Tensor::empty(inputs.begin()->shape(), d);
}

}  // namespace d2l::detail
