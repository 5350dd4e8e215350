#include "core/copy.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "core/gpu/cuda_layer.hpp"
#include "core/runtime.hpp"

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

}  // namespace d2l
