#include "core/tensor.hpp"

#include <cstring>

#include "core/gpu/cuda_layer.hpp"
#include "core/runtime.hpp"

namespace d2l {

TensorImpl& Tensor::impl() const {
  if (!p_) throw std::logic_error("use of an undefined tensor");
  return *p_;
}

Tensor Tensor::empty(const Shape& shape, Device d, DType t) {
  for (auto n : shape)
    if (n < 0) throw ShapeError("bad shape " + d2l::str(shape) + ": dimensions must be >= 0");
  auto p = std::make_shared<TensorImpl>();
  p->shape = shape;
  p->dtype = t;
  p->device = d;
  DeviceRuntime& rt = runtime(d);
  const size_t bytes = static_cast<size_t>(d2l::numel(shape)) * 4;
  p->storage = std::make_shared<Storage>(rt.allocator, bytes, rt.compute.clock());  // for compute's work
  if (fill_nan() && bytes > 0) {  // NaN everywhere, in stream order (the block's last readers may be queued)
    void* ptr = p->storage->ptr;
    const int g = rt.physical;
    rt.compute.enqueue_untraced("fill nan", [ptr, bytes, g] {
      if (g >= 0) cuda_layer::fill_bytes(g, ptr, 0xFF, bytes);
      else std::memset(ptr, 0xFF, bytes);
    });
  }
  return Tensor(p);
}

int64_t Tensor::dim(int i) const {
  int64_t n = ndim();
  int64_t k = i < 0 ? n + i : i;
  if (k < 0 || k >= n) throw ShapeError("dim " + std::to_string(i) + " out of range for shape " + d2l::str(shape()));
  return shape()[k];
}

// A tensor whose memory was handed back while its handle lives on: a parameter replica that ZeRO
// stage 3 (core/optim/fsdp.hpp) keeps whole only while its unit runs.
[[noreturn]] static void throw_released(const TensorImpl& t) {
  throw std::logic_error("a tensor " + str(t.shape) + " on " + t.device.str() +
                         " has no memory now: a parameter sharded by zero_stage 3 is whole only inside "
                         "FullyShardedDataParallel's forward and backward");
}

void check_has_memory(const Tensor& t) {
  if (!t.impl().storage) throw_released(t.impl());
}

float* Tensor::data() const {
  if (impl().dtype != DType::f32) throw ShapeError("expected a float32 tensor, got int32 " + d2l::str(shape()));
  if (!impl().storage) throw_released(impl());
  return static_cast<float*>(impl().storage->ptr);
}

int32_t* Tensor::labels() const {
  if (impl().dtype != DType::i32) throw ShapeError("expected an int32 tensor, got float32 " + d2l::str(shape()));
  if (!impl().storage) throw_released(impl());
  return static_cast<int32_t*>(impl().storage->ptr);
}

Tensor& Tensor::requires_grad(bool on) {
  impl().requires_grad = on;
  return *this;
}

bool Tensor::needs_grad() const { return impl().requires_grad || impl().grad_fn != nullptr; }

Tensor Tensor::grad() const { return Tensor(impl().grad); }

Tensor Tensor::detach() const {
  auto p = std::make_shared<TensorImpl>(impl());
  p->requires_grad = false;
  p->grad_fn = nullptr;
  p->grad = nullptr;
  return Tensor(p);
}

}  // namespace d2l
