// Devices as the book prints them: cpu(0), gpu(1), emu(0) (DESIGN.md "Devices, streams, memory").
// cpu(i): a compute device whose memory is host memory, run by worker threads.
// gpu(i): a real CUDA GPU.  emu(i): a GPU emulated on the CPU (the CUDA kernels, run without a GPU).
#pragma once
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

namespace d2l {

enum class DeviceKind { cpu, gpu, emu };

struct Device {
  DeviceKind kind = DeviceKind::cpu;
  int index = 0;
  std::string str() const;  // "cpu(0)"
  bool operator==(const Device&) const = default;
  auto operator<=>(const Device&) const = default;
};

inline Device cpu(int i = 0) { return {DeviceKind::cpu, i}; }
inline Device gpu(int i = 0) { return {DeviceKind::gpu, i}; }
inline Device emu(int i = 0) { return {DeviceKind::emu, i}; }

std::ostream& operator<<(std::ostream& os, const Device& d);
std::string str(const std::vector<Device>& ds);  // "[cpu(0), cpu(1)]"

// A bad device list, flag value or unavailable backend: one line, shown to the user as is.
struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "cpu:0" or "cpu(0)" -> cpu(0). Throws ConfigError naming the text and the expected form.
Device parse_device(const std::string& text);
// "gpu:0,gpu:1" -> [gpu(0), gpu(1)]; rejects empty items and duplicates.
std::vector<Device> parse_devices(const std::string& text);

// Real GPUs present (0 when built without CUDA, without a driver, or with none).
int num_gpus();
bool built_with_cuda();  // the CUDA runtime is linked (gpu option enabled and nvcc found)
// Whether a backend for this kind is compiled in; kinds that are not say so when used.
bool backend_built(DeviceKind kind);

// The book's `--num-gpus k`, resolved against the GPUs present:
// k GPUs when k exist; no GPU at all -> k CPU devices, with `note` saying so;
// 0 < GPUs < k -> ConfigError naming the count and --devices. k < 1 -> ConfigError.
struct DeviceChoice {
  std::vector<Device> devices;
  std::string note;  // empty, or one line to print
};
DeviceChoice resolve_num_gpus(int k, int gpus_present);

}  // namespace d2l
