#include "core/tensor.hpp"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/gpu/cuda_layer.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

namespace d2l {

std::string str(const Shape& s) {
  std::string out = "(";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + (s.size() == 1 ? ",)" : ")");
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (auto d : s) n *= d;
  return n;
}

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

template <class T>
static Tensor from_host(const std::vector<T>& v, const Shape& shape, Device d, DType t) {
  if (static_cast<int64_t>(v.size()) != numel(shape))
    throw ShapeError("from_vector: " + std::to_string(v.size()) + " values do not fill shape " + str(shape));
  Tensor x = Tensor::empty(shape, d, t);
  copy_from_host(v.data(), v.size() * sizeof(T), x);
  return x;
}

Tensor Tensor::from_vector(const std::vector<float>& v, const Shape& shape, Device d) {
  return from_host(v, shape, d, DType::f32);
}
Tensor Tensor::from_vector(const std::vector<int32_t>& v, const Shape& shape, Device d) {
  return from_host(v, shape, d, DType::i32);
}

Tensor Tensor::arange(int64_t n, Device d) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(i);
  return from_vector(v, {n}, d);
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

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  copy_to_host(*this, out.data(), out.size() * 4);
  return out;
}

std::vector<int32_t> Tensor::to_labels() const {
  std::vector<int32_t> out(static_cast<size_t>(numel()));
  labels();  // dtype check
  copy_to_host(*this, out.data(), out.size() * 4);
  return out;
}

float Tensor::item() const {
  if (numel() != 1) throw ShapeError("item() needs a one-element tensor, got shape " + d2l::str(shape()));
  return to_vector()[0];
}

Tensor& Tensor::attach_grad() {
  impl().requires_grad = true;
  impl().grad_fn = nullptr;
  MemoryTagScope tag(MemoryTag::gradients);
  impl().grad = zeros(shape(), device()).ptr();
  return *this;
}

Tensor& Tensor::requires_grad(bool on) {
  impl().requires_grad = on;
  return *this;
}

bool Tensor::needs_grad() const { return impl().requires_grad || impl().grad_fn != nullptr; }

Tensor Tensor::grad() const { return Tensor(impl().grad); }

void Tensor::zero_grad() const {
  if (impl().grad) fill_(Tensor(impl().grad), 0.0f);
}

void Tensor::backward() const { d2l::backward(*this); }

Tensor Tensor::detach() const {
  auto p = std::make_shared<TensorImpl>(impl());
  p->requires_grad = false;
  p->grad_fn = nullptr;
  p->grad = nullptr;
  return Tensor(p);
}

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  Tensor out = empty(shape(), d, dtype());
  copy_between(*this, out);
  Device src = device();
  if (dtype() == DType::f32)
    record(out, "copy", {*this}, [src](const Tensor& g) { return std::vector<Tensor>{g.to(src)}; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), device(), dtype());
  copy_between(*this, out);
  if (dtype() == DType::f32) record(out, "clone", {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
  return out;
}

void Tensor::copyto(const Tensor& dst) const {
  if (dst.shape() != shape() || dst.dtype() != dtype())
    throw ShapeError("copyto: source " + d2l::str(shape()) + " and destination " + d2l::str(dst.shape()) +
                     " differ in shape or dtype");
  copy_between(*this, dst);
}

// Nested brackets as NumPy/MXNet print them, then the shape and the device:
// [[1. 1.]]
// <Tensor 1x2 @cpu(0)>
static void print_block(std::ostringstream& os, const std::vector<float>& v, const Shape& s, size_t dim,
                        int64_t& at, int indent, bool is_int) {
  if (dim == s.size()) {
    float x = v[static_cast<size_t>(at++)];
    if (is_int) os << static_cast<int64_t>(x);
    else if (x == static_cast<float>(static_cast<int64_t>(x)) && std::fabs(x) < 1e7f) os << static_cast<int64_t>(x) << ".";
    else os << x;
    return;
  }
  os << "[";
  for (int64_t i = 0; i < s[dim]; ++i) {
    if (i) {
      if (dim + 1 == s.size()) os << " ";
      else os << "\n" << std::string(static_cast<size_t>(indent + 1), ' ');
    }
    print_block(os, v, s, dim + 1, at, indent + 1, is_int);
  }
  os << "]";
}

std::string Tensor::str() const {
  std::ostringstream os;
  os << std::setprecision(7);
  std::vector<float> v;
  bool is_int = dtype() == DType::i32;
  if (!is_int) v = to_vector();
  else for (auto x : to_labels()) v.push_back(static_cast<float>(x));
  int64_t at = 0;
  print_block(os, v, shape(), 0, at, 0, is_int);
  os << "\n<Tensor ";
  for (size_t i = 0; i < shape().size(); ++i) os << (i ? "x" : "") << shape()[i];
  os << " @" << device() << ">";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

}  // namespace d2l
