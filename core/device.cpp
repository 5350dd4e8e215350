#include "core/device.hpp"

#include <algorithm>
#include <cctype>
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

std::vector<Device> parse_devices(const std::string& text) {
  std::vector<Device> out;
  std::stringstream ss(text);
  std::string item;
  if (text.empty()) throw ConfigError("bad --devices '': expected a comma-separated list such as cpu:0,cpu:1");
  while (std::getline(ss, item, ',')) {
    if (item.empty()) throw ConfigError("bad --devices '" + text + "': empty item in the list");
    Device d = parse_device(item);
    if (std::find(out.begin(), out.end(), d) != out.end())
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

}  // namespace d2l
