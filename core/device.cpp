#include "core/device.hpp"

#include <algorithm>
#include <cctype>
#include <map>
#include <sstream>

namespace d2l {

static const char* kind_name(DeviceKind k) {
  switch (k) {
    case DeviceKind::cpu: return "cpu";
    case DeviceKind::gpu: return "gpu";
    case DeviceKind::emu: return "emu";
  }
  return "?";
}

std::string Device::str() const { return std::string(kind_name(kind)) + "(" + std::to_string(index) + ")"; }
std::ostream& operator<<(std::ostream& os, const Device& d) { return os << d.str(); }

std::string str(const std::vector<Device>& ds) {
  std::string s = "[";
  for (size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + ds[i].str();
  return s + "]";
}

Device parse_device(const std::string& text) {
  auto bad = [&] {
    return ConfigError("bad device '" + text + "': expected cpu:N, gpu:N or emu:N with N >= 0 (e.g. cpu:0)");
  };
  std::string t = text;
  std::string name, num;
  size_t sep = t.find_first_of(":(");
  if (sep == std::string::npos) throw bad();
  name = t.substr(0, sep);
  num = t.substr(sep + 1);
  if (t[sep] == '(') {
    if (num.empty() || num.back() != ')') throw bad();
    num.pop_back();
  }
  if (num.empty() || num.size() > 4 || !std::all_of(num.begin(), num.end(), [](unsigned char c) { return std::isdigit(c); }))
    throw bad();
  Device d;
  if (name == "cpu") d.kind = DeviceKind::cpu;
  else if (name == "gpu") d.kind = DeviceKind::gpu;
  else if (name == "emu") d.kind = DeviceKind::emu;
  else throw bad();
  d.index = std::stoi(num);
  return d;
}

std::vector<Device> parse_devices(const std::string& text, bool gpu_repeats) {
  std::vector<Device> out;
  std::stringstream ss(text);
  std::string item;
  if (text.empty()) throw ConfigError("bad --devices '': expected a comma-separated list such as cpu:0,cpu:1");
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw ConfigError("bad --devices '" + text + "': empty item in the list");
    Device d = parse_device(item);
    if (!(gpu_repeats && d.kind == DeviceKind::gpu) && std::find(out.begin(), out.end(), d) != out.end())
      throw ConfigError("bad --devices '" + text + "': " + d.str() + " is listed twice");
    out.push_back(d);
  }
  if (!text.empty() && text.back() == ',') throw ConfigError("bad --devices '" + text + "': empty item in the list");
  return out;
}

DeviceChoice resolve_num_gpus(int k, int gpus_present) {
  if (k < 1) throw ConfigError("bad --num-gpus " + std::to_string(k) + ": expected a count >= 1");
  DeviceChoice c;
  if (gpus_present >= k) {
    for (int i = 0; i < k; ++i) c.devices.push_back(gpu(i));
  } else if (gpus_present == 0) {
    for (int i = 0; i < k; ++i) c.devices.push_back(cpu(i));
    c.note = "note: no GPU found; using " + std::to_string(k) + " CPU device" + (k > 1 ? "s " : " ") +
             str(c.devices) + " instead (--devices chooses explicitly)";
  } else {
    throw ConfigError("--num-gpus " + std::to_string(k) + " asks for more GPUs than the " +
                      std::to_string(gpus_present) + " present; use --num-gpus " + std::to_string(gpus_present) +
                      " or list devices with --devices (e.g. --devices gpu:0,cpu:0)");
  }
  return c;
}

int parse_logical_gpus(const char* text) {
  if (!text) return 1;
  const std::string t(text);
  bool digits = !t.empty() && t.size() <= 3 && t.find_first_not_of("0123456789") == std::string::npos;
  int k = digits ? std::stoi(t) : 0;
  if (k < 1 || k > 64)
    throw ConfigError("bad D2L_LOGICAL_GPUS '" + t.substr(0, 40) +
                      "': expected a whole number of logical GPUs per GPU from 1 to 64 (or unset it)");
  return k;
}

std::vector<int> split_gpus(int physical_gpus, int split) {
  std::vector<int> map;
  for (int i = 0; i < physical_gpus * split; ++i) map.push_back(i / split);
  return map;
}

std::string logical_gpus_note(const std::vector<Device>& devices, const std::vector<int>& gpu_map) {
  std::map<int, std::vector<Device>> on;  // physical GPU -> the listed logical GPUs on it
  bool shared = false;
  for (const Device& d : devices)
    if (d.kind == DeviceKind::gpu && d.index < static_cast<int>(gpu_map.size())) {
      auto& v = on[gpu_map[d.index]];
      v.push_back(d);
      shared |= v.size() > 1;
    }
  if (!shared) return "";
  std::string s = "note: ";
  for (auto& [p, ds] : on) {
    if (s.size() > 6) s += "; ";
    for (size_t i = 0; i < ds.size(); ++i) s += (i ? ", " : "") + ds[i].str();
    s += ds.size() == 1 ? " is on" : ds.size() == 2 ? " are logical devices, both on" : " are logical devices, all on";
    s += " physical GPU " + std::to_string(p);
  }
  return s + " (logical devices share their GPU's compute: the run shows the mechanics, not a speed-up)";
}

DevicePlan plan_devices(const std::string& devices_flag, int num_gpus_flag, const char* logical_gpus_env,
                        int physical_gpus) {
  const int split = parse_logical_gpus(logical_gpus_env);
  DevicePlan plan;
  plan.gpu_map = split_gpus(physical_gpus, split);
  const int logical = static_cast<int>(plan.gpu_map.size());
  if (devices_flag.empty()) {
    DeviceChoice c = resolve_num_gpus(num_gpus_flag, logical);
    plan.devices = c.devices;
    if (!c.note.empty()) plan.notes.push_back(c.note);
  } else {
    // With D2L_LOGICAL_GPUS the items name logical GPUs, each at most once; without it a physical
    // GPU may be listed more than once.
    plan.devices = parse_devices(devices_flag, split == 1);
    std::vector<int> listed;  // the physical GPU of each gpu item, in list order
    for (const Device& d : plan.devices) {
      if (d.kind != DeviceKind::gpu) continue;
      if (d.index >= logical)
        throw ConfigError("no device " + d.str() + ": this machine has " + std::to_string(physical_gpus) + " GPU(s)" +
                          (split > 1 ? " split into " + std::to_string(logical) + " logical ones by D2L_LOGICAL_GPUS" : "") +
                          "; list a GPU twice (gpu:0,gpu:0) or set D2L_LOGICAL_GPUS=2 for two logical devices on one, "
                          "or use cpu or emu devices (e.g. --devices emu:0,emu:1)");
      listed.push_back(d.index);
    }
    std::vector<int> sorted = listed;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
      // A physical GPU listed twice: the gpu items become logical gpu(0), gpu(1), ... in list order.
      plan.gpu_map = listed;
      int next = 0;
      for (Device& d : plan.devices)
        if (d.kind == DeviceKind::gpu) d.index = next++;
    }
  }
  if (std::string note = logical_gpus_note(plan.devices, plan.gpu_map); !note.empty()) plan.notes.push_back(note);
  return plan;
}

}  // namespace d2l
