// Tensors: float32 data, int32 labels, or 16-bit floats (bfloat16, float16: kernels/cpu/float16.hpp),
// contiguous row-major (NCHW), living on one device.
// A Tensor is a handle (shared); ops enqueue work on the device's streams and return at once.
// Reading values (to_vector, item) waits for the device.
// The methods live on the floor of what they do: the handle and its memory here (core/tensor.cpp);
// zeros, ones and full with the fill op (core/ops/fill.cpp); the copies to and from the host and
// between devices, and printing, with the copies (core/copy.cpp); the gradients with the backward
// pass (core/backward.cpp).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.hpp"
#include "core/device.hpp"
#include "core/shape.hpp"

namespace d2l {

enum class DType { f32, i32, bf16, f16 };
size_t dtype_size(DType t);       // bytes per element: 4, 4, 2, 2
const char* dtype_name(DType t);  // "float32", "int32", "bfloat16", "float16" (PyTorch's names)
inline bool is_float(DType t) { return t != DType::i32; }  // what carries gradients

struct Node;  // core/autograd.hpp

struct TensorImpl {
  Shape shape;
  DType dtype = DType::f32;
  Device device;
  std::shared_ptr<Storage> storage;
  bool requires_grad = false;       // a leaf whose gradient is wanted
  bool parameter = false;           // a Parameter's replica (core/parameter.hpp): autocast keeps one copy a scope
  std::shared_ptr<Node> grad_fn;    // how this result was made (null for leaves)
  std::shared_ptr<TensorImpl> grad; // accumulated gradient of a leaf, same shape and device
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> p) : p_(std::move(p)) {}

  // Uninitialised memory from the device's allocator.
  static Tensor empty(const Shape& shape, Device d, DType t = DType::f32);
  static Tensor zeros(const Shape& shape, Device d, DType t = DType::f32);
  static Tensor ones(const Shape& shape, Device d);
  static Tensor full(const Shape& shape, float value, Device d);
  // Copies host values onto d (on d's copy stream).
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape, Device d);
  static Tensor from_vector(const std::vector<int32_t>& v, const Shape& shape, Device d);
  static Tensor arange(int64_t n, Device d);  // 0, 1, ..., n-1 as float

  bool defined() const { return p_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  int64_t dim(int i) const;  // negative counts from the end
  int64_t ndim() const { return static_cast<int64_t>(shape().size()); }
  int64_t numel() const { return d2l::numel(shape()); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().device; }

  // Raw device pointers, for kernels (valid now; contents valid once queued work has run).
  float* data() const;
  int32_t* labels() const;
  uint16_t* data16() const;  // a bfloat16 or float16 tensor's bits
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }

  // Waits for the device, then copies the values to the host (16-bit floats widened, exactly).
  std::vector<float> to_vector() const;
  std::vector<int32_t> to_labels() const;
  float item() const;  // the value of a one-element tensor

  // Autograd. attach_grad() marks a leaf and gives it a zero gradient (the book's x.attach_grad()).
  Tensor& attach_grad();
  Tensor& requires_grad(bool on = true);
  bool needs_grad() const;  // a leaf that wants a gradient, or a result of one
  Tensor grad() const;      // the accumulated gradient (undefined before any backward)
  void zero_grad() const;
  void backward() const;    // from a one-element tensor: accumulates into every reachable leaf
  Tensor detach() const;    // same storage, no history

  // Copies. to() is differentiable: the gradient flows back to the source device.
  Tensor to(Device d) const;  // returns *this when already on d
  Tensor clone() const;
  void copyto(const Tensor& dst) const;  // in place into dst (same shape), any devices

  std::string str() const;  // values and "<Tensor 2x3 @cpu(0)>", waits for the device
  TensorImpl& impl() const;
  const std::shared_ptr<TensorImpl>& ptr() const { return p_; }
  bool same(const Tensor& o) const { return p_ == o.p_; }

 private:
  std::shared_ptr<TensorImpl> p_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);
// A logic_error in one line when t's memory was released (a ZeRO-3 replica between its uses);
// data() and the copies check it.
void check_has_memory(const Tensor& t);

}  // namespace d2l
