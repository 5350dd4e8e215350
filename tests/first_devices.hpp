// The tests' device lists: the first n devices of a kind, cpu(0) ... cpu(n - 1) (or emu), made the
// process's devices (use_devices: each gets its share of the thread budget) unless `use` is false.
#pragma once
#include <vector>

#include "core/device.hpp"
#include "core/runtime.hpp"

namespace d2l::test {

inline std::vector<Device> first_devices(int n, DeviceKind kind = DeviceKind::cpu, bool use = true) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device{kind, i});
  if (use) use_devices(d);
  return d;
}

}  // namespace d2l::test
