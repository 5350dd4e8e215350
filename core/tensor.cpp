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
  const size_t bytes = static_cast<size_t>(d2l::numel(shape)) * dtype_size(t);
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

size_t dtype_size(DType t) { return t == DType::bf16 || t == DType::f16 ? 2 : 4; }

const char* dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "float32";
    case DType::i32: return "int32";
    case DType::bf16: return "bfloat16";
    case DType::f16: return "float16";
  }
  return "?";
}

// The memory of t, whose dtype must be one of `want` (named in the error).
static void* memory_of(const TensorImpl& t, bool ok, const char* want) {
  if (!ok) throw ShapeError(std::string("expected a ") + want + " tensor, got " + dtype_name(t.dtype) + " " + d2l::str(t.shape));
  if (!t.storage) throw_released(t);
  return t.storage->ptr;
}

float* Tensor::data() const { return static_cast<float*>(memory_of(impl(), dtype() == DType::f32, "float32")); }

int32_t* Tensor::labels() const { return static_cast<int32_t*>(memory_of(impl(), dtype() == DType::i32, "int32")); }

uint16_t* Tensor::data16() const {
  return static_cast<uint16_t*>(memory_of(impl(), dtype() == DType::bf16 || dtype() == DType::f16, "bfloat16 or float16"));
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
