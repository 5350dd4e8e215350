#include "core/copy.hpp"

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

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

void copy_between(const Tensor& src, const Tensor& dst) {
  size_t bytes = src.storage()->bytes;
  if (dst.storage()->bytes != bytes)
    throw ShapeError("copy: " + str(src.shape()) + " does not fit into " + str(dst.shape()));
  if (src.storage() == dst.storage()) return;
  copy_bytes(src, 0, dst, 0, bytes);
}

void copy_bytes(const Tensor& src, size_t src_offset, const Tensor& dst, size_t dst_offset, size_t bytes) {
  if (src_offset + bytes > src.storage()->bytes || dst_offset + bytes > dst.storage()->bytes)
    throw ShapeError("copy: byte range outside a tensor");
  if (bytes == 0) return;
  DeviceRuntime& s = runtime(src.device());
  DeviceRuntime& d = runtime(dst.device());
  const void* from = static_cast<const char*>(src.storage()->ptr) + src_offset;
  void* to = static_cast<char*>(dst.storage()->ptr) + dst_offset;
  auto keep_src = src.storage(), keep_dst = dst.storage();
  if (&s == &d) {  // on one device: an ordinary kernel on its compute stream
    launch(src.device(), "copy", {keep_src, keep_dst}, [=](const kernels::cpu::Ctx&) { std::memcpy(to, from, bytes); });
    return;
  }
  Event src_ready, dst_free, done;
  s.compute.record(src_ready);  // the source's value is complete
  d.compute.record(dst_free);   // earlier kernels on d are done reading the destination
  d.copy.wait(src_ready);
  d.copy.wait(dst_free);
  d.copy.enqueue("copy", [keep_src, keep_dst, from, to, bytes] { std::memcpy(to, from, bytes); });
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
  auto keep = dst.storage();
  Event dst_free, done;
  d.compute.record(dst_free);
  d.copy.wait(dst_free);
  d.copy.enqueue("copy from host", [staged, keep, bytes] { std::memcpy(keep->ptr, staged->data(), bytes); });
  d.copy.record(done);
  d.compute.wait(done);
}

void copy_to_host(const Tensor& src, void* host, size_t bytes) {
  DeviceRuntime& s = runtime(src.device());
  s.compute.synchronize();  // every copy into s is waited for by s's compute stream
  s.copy.synchronize();
  std::memcpy(host, src.storage()->ptr, bytes);
}

}  // namespace d2l
