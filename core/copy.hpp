// Copies between host and devices and between devices (docs/devices-and-streams.md): a copy into device d runs on
// d's copy stream after an event from the source's compute stream; d's compute stream waits for it
// before using the result, and the source waits before it may overwrite what is being read.
#pragma once
#include <cstddef>

#include <memory>

#include "core/stream.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/parallel.hpp"

namespace d2l {
struct LaunchCtx;  // core/runtime.hpp

void copy_between(const Tensor& src, const Tensor& dst);  // same byte size; any two devices
// Bytes [src_offset, +bytes) of src into [dst_offset, +bytes) of dst, ordered like copy_between.
void copy_bytes(const Tensor& src, size_t src_offset, const Tensor& dst, size_t dst_offset, size_t bytes);
void copy_from_host(const void* host, size_t bytes, const Tensor& dst);  // host buffer copied at once
void copy_to_host(const Tensor& src, void* host, size_t bytes);           // waits for src's device
// A one-element float tensor's value read in stream order: the copy to the host is queued on its
// device's compute stream right away, so value() waits for the work queued before that read and not
// for what the host queues after it (a training loop reads step t's loss while step t+1 runs).
class HostValue {
 public:
  float value() const;  // waits for the read
 private:
  friend HostValue read_later(const Tensor& t);
  std::shared_ptr<float> v_;
  Event ready_;
};
HostValue read_later(const Tensor& t);

// Inside a kernel task on device d (c: its LaunchCtx): memcpy for host memory, a stream-ordered
// device-to-device copy on a GPU.
void copy_on_device(Device d, const LaunchCtx& c, void* to, const void* from, size_t bytes);

// Bytes copied into each device's memory from another device (chapter 1 counts traffic with these).
struct CopyCounters {
  int64_t bytes_in = 0, bytes_out = 0, copies = 0;
};
CopyCounters copy_counters(Device d);
void reset_copy_counters();

}  // namespace d2l
