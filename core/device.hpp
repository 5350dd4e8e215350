// Devices as the book prints them: cpu(0), gpu(1), emu(0) (docs/devices-and-streams.md).
// cpu(i): a compute device whose memory is host memory, run by worker threads.
// gpu(i): a GPU, logical: on physical GPU physical_gpu(i) (below).  emu(i): a GPU emulated on the CPU (the CUDA kernels, run without a GPU).
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
// An error raised on a device: inside a stream's work, rethrown at the next synchronisation ("relu
// on cpu(1): ..."), or by the CUDA layer (core/gpu).
struct DeviceError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "cpu:0" or "cpu(0)" -> cpu(0). Throws ConfigError naming the text and the expected form.
Device parse_device(const std::string& text);
// "gpu:0,gpu:1" -> [gpu(0), gpu(1)]; rejects empty items and duplicates (gpu_repeats: a gpu item
// may repeat, as in gpu:0,gpu:0; cpu and emu items never may).
std::vector<Device> parse_devices(const std::string& text, bool gpu_repeats = false);

// ---- Logical GPUs (README.md "Devices"). gpu(i) is a logical device with its own streams,
// events, cuBLAS handle and allocator pool; the GPU map gives the physical GPU it runs on. By default
// the map is the identity (gpu(i) is physical GPU i). Two ways give several logical GPUs on one
// physical GPU, all sharing its compute:
//   D2L_LOGICAL_GPUS=K  each physical GPU p is split into K logical ones, gpu(p*K) .. gpu(p*K+K-1);
//                       --devices and --num-gpus then count logical GPUs.
//   --devices gpu:0,gpu:0  a physical GPU listed more than once: the list's gpu items become
//                       gpu(0), gpu(1), ... in list order, each on the physical GPU it names.

// D2L_LOGICAL_GPUS's value (null: unset, 1) -> K. Throws ConfigError
// "bad D2L_LOGICAL_GPUS 'x': expected a whole number of logical GPUs per GPU from 1 to 64 (or unset it)".
int parse_logical_gpus(const char* text);
// The map of `physical_gpus` GPUs each split into `split`: logical i -> physical i / split.
std::vector<int> split_gpus(int physical_gpus, int split);

// Everything the device flags decide, as a function of the flags, D2L_LOGICAL_GPUS's text (null:
// unset) and the physical GPU count (tests pass any count). devices_flag non-empty: --devices, else
// --num-gpus k. ConfigError for a bad list, a GPU beyond the map ("no device gpu(1): ...") or a bad
// D2L_LOGICAL_GPUS; --num-gpus errors as resolve_num_gpus. The caller adds "bad --devices ...".
struct DevicePlan {
  std::vector<Device> devices;
  std::vector<int> gpu_map;        // gpu_map[i]: the physical GPU of logical gpu(i)
  std::vector<std::string> notes;  // lines to print once: CPU devices standing in, logical GPUs
};
DevicePlan plan_devices(const std::string& devices_flag, int num_gpus_flag, const char* logical_gpus_env,
                        int physical_gpus);
// "note: gpu(0), gpu(1) are logical devices, both on physical GPU 0 ..." when some of `devices`
// share a physical GPU under `gpu_map`, else "".
std::string logical_gpus_note(const std::vector<Device>& devices, const std::vector<int>& gpu_map);

// Physical GPUs present (0 when built without CUDA, without a driver, or with none).
int num_physical_gpus();
// The process's GPU map: split_gpus(num_physical_gpus(), D2L_LOGICAL_GPUS) until set_gpu_map()
// installs another (choose_devices installs its plan's). set_gpu_map refuses (ConfigError) to move a
// gpu(i) whose runtime exists already to another physical GPU.
std::vector<int> gpu_map();
void set_gpu_map(std::vector<int> map);
// Logical GPUs: the map's size (num_physical_gpus() * K with D2L_LOGICAL_GPUS=K).
int num_gpus();
// The physical GPU of logical gpu(i): what every CUDA call of gpu(i) uses. i must be < num_gpus().
int physical_gpu(int logical);
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
