#include "core/copy.hpp"

#include <cmath>
#include <cstring>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/autograd.hpp"
#include "core/gpu/cuda_layer.hpp"
#include "core/runtime.hpp"
#include "kernels/cpu/float16.hpp"

namespace d2l {

namespace {
std::mutex counters_mu;
std::map<Device, CopyCounters> counters;
}  // namespace

CopyCounters copy_counters(Device d) {
  std::lock_guard<std::mutex> lock(counters_mu);
  return counters[d];
}

void reset_copy_counters() {
  std::lock_guard<std::mutex> lock(counters_mu);
  counters.clear();
}

// The physical GPU of a gpu(i) device (logical GPUs share one); -1 for host memory. Two logical
// GPUs on one physical GPU copy device to device on the stream, with no peer access involved.
static int gpu_of(Device d) { return d.kind == DeviceKind::gpu ? runtime(d).physical : -1; }

// Moves bytes as a task of a stream of device `on`: a memcpy when both sides are host memory (cpu,
// emu), otherwise the CUDA layer, queued on that stream's CUDA stream and waited for (a copy task
// ends when its bytes have landed, so the task's storage may be released after it).
static void transfer(void* to, Device to_dev, const void* from, Device from_dev, size_t bytes, void* cuda_stream) {
  if (bytes == 0) return;  // an empty tensor may have no memory at all (memcpy of null is undefined)
  if (gpu_of(to_dev) < 0 && gpu_of(from_dev) < 0) std::memcpy(to, from, bytes);
  else cuda_layer::copy(to, gpu_of(to_dev), from, gpu_of(from_dev), bytes, cuda_stream, true);
}

void copy_on_device(Device d, const LaunchCtx& c, void* to, const void* from, size_t bytes) {
  if (bytes == 0) return;
  if (c.cuda_stream) cuda_layer::copy(to, gpu_of(d), from, gpu_of(d), bytes, c.cuda_stream, false);  // stream-ordered
  else std::memcpy(to, from, bytes);
}

void copy_between(const Tensor& src, const Tensor& dst) {
  check_has_memory(src);
  check_has_memory(dst);
  size_t bytes = src.storage()->bytes;
  if (dst.storage()->bytes != bytes)
    throw ShapeError("copy: " + str(src.shape()) + " does not fit into " + str(dst.shape()));
  if (src.storage() == dst.storage()) return;
  copy_bytes(src, 0, dst, 0, bytes);
}

void copy_bytes(const Tensor& src, size_t src_offset, const Tensor& dst, size_t dst_offset, size_t bytes) {
  check_has_memory(src);
  check_has_memory(dst);
  if (src_offset + bytes > src.storage()->bytes || dst_offset + bytes > dst.storage()->bytes)
    throw ShapeError("copy: byte range outside a tensor");
  if (bytes == 0) return;
  DeviceRuntime& s = runtime(src.device());
  DeviceRuntime& d = runtime(dst.device());
  const void* from = static_cast<const char*>(src.storage()->ptr) + src_offset;
  void* to = static_cast<char*>(dst.storage()->ptr) + dst_offset;
  if (&s == &d) {  // on one device: an ordinary kernel on its compute stream
    launch(src.device(), "copy", {src.storage(), dst.storage()}, [=, d = src.device()](const LaunchCtx& c) {
      copy_on_device(d, c, to, from, bytes);
    });
    return;
  }
  Event src_ready, dst_free, done;
  s.compute.record(src_ready);  // the source's value is complete
  d.compute.record(dst_free);   // earlier kernels on d are done reading the destination
  d.copy.wait(src_ready);
  d.copy.wait(dst_free);
  Device sd = src.device(), dd = dst.device();
  void* stream = d.gpu.copy ? d.gpu.copy : s.gpu.copy;  // a gpu -> cpu copy runs on the GPU's copy stream
  // The copy holds neither tensor: both compute streams wait for it (below) and it waits for both, so
  // whatever reuses their blocks in stream order (core/allocator.hpp) runs after it.
  d.copy.enqueue("copy", [from, to, bytes, sd, dd, stream] { transfer(to, dd, from, sd, bytes, stream); });
  d.copy.record(done);
  d.compute.wait(done);  // d computes with the copy only once it has landed
  s.compute.wait(done);  // s does not overwrite the source while it is being read
  std::lock_guard<std::mutex> lock(counters_mu);
  counters[src.device()].bytes_out += static_cast<int64_t>(bytes);
  counters[dst.device()].bytes_in += static_cast<int64_t>(bytes);
  counters[dst.device()].copies += 1;
}

void copy_from_host(const void* host, size_t bytes, const Tensor& dst) {
  DeviceRuntime& d = runtime(dst.device());
  auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(host),
                                                             static_cast<const unsigned char*>(host) + bytes);
  Event dst_free, done;
  d.compute.record(dst_free);
  d.copy.wait(dst_free);
  Device dd = dst.device();
  void* stream = d.gpu.copy;
  void* to = dst.storage()->ptr;  // not held: d's compute stream waits for the copy (as copy_bytes)
  d.copy.enqueue("copy from host", [staged, to, bytes, dd, stream] { transfer(to, dd, staged->data(), cpu(0), bytes, stream); });
  d.copy.record(done);
  d.compute.wait(done);
}

HostValue read_later(const Tensor& t) {
  if (t.numel() != 1 || t.dtype() != DType::f32)
    throw ShapeError("read_later: a one-element float32 tensor is needed, got " + str(t.shape()));
  DeviceRuntime& rt = runtime(t.device());
  HostValue h;
  h.v_ = std::make_shared<float>(0.0f);
  rt.compute.enqueue_untraced("read value", [keep = t.storage(), out = h.v_, d = t.device(), stream = rt.gpu.compute] {
    transfer(out.get(), cpu(0), keep->ptr, d, sizeof(float), stream);
  });
  rt.compute.record(h.ready_);
  return h;
}

float HostValue::value() const {
  ready_.synchronize();
  return *v_;
}

void copy_to_host(const Tensor& src, void* host, size_t bytes) {
  check_has_memory(src);
  DeviceRuntime& s = runtime(src.device());
  s.compute.synchronize();  // every copy into s is waited for by s's compute stream
  s.copy.synchronize();
  if (work_cancelled()) throw WorkCancelled();  // src may never have been computed
  transfer(host, cpu(0), src.storage()->ptr, src.device(), bytes, nullptr);
}

// ---- Tensor's methods that copy (core/tensor.hpp): from the host, to it, between devices.

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

std::vector<float> Tensor::to_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  if (dtype() == DType::bf16 || dtype() == DType::f16) {
    std::vector<uint16_t> bits(out.size());
    copy_to_host(*this, bits.data(), bits.size() * 2);
    const auto f = dtype() == DType::bf16 ? kernels::cpu::Float16::bf16 : kernels::cpu::Float16::f16;
    for (size_t i = 0; i < out.size(); ++i) out[i] = kernels::cpu::widen(f, bits[i]);
    return out;
  }
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

Tensor Tensor::to(Device d) const {
  if (device() == d) return *this;
  Tensor out = empty(shape(), d, dtype());
  copy_between(*this, out);
  Device src = device();
  if (is_float(dtype()))
    record(out, "copy", {*this}, [src](const Tensor& g) { return std::vector<Tensor>{g.to(src)}; });
  return out;
}

Tensor Tensor::clone() const {
  Tensor out = empty(shape(), device(), dtype());
  copy_between(*this, out);
  if (is_float(dtype())) record(out, "clone", {*this}, [](const Tensor& g) { return std::vector<Tensor>{g}; });
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
