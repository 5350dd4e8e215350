#include "core/cli.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <sstream>

#include "core/ops_util.hpp"
#include "core/parameter.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"

namespace d2l {

void add_device_flags(CLI::App& app, DeviceFlags& f) {
  app.add_option("--num-gpus", f.num_gpus,
                 "number of GPUs to train on; CPU devices stand in when the machine has no GPU")
      ->capture_default_str();
  app.add_option("--devices", f.devices, "explicit device list, e.g. cpu:0,cpu:1, gpu:0,gpu:1 or emu:0,emu:1 (overrides --num-gpus)");
  app.add_option("--gemm", f.gemm, "GEMM on GPUs: cublas, tiled, regblock or naive (hand-written CUDA kernels)")
      ->capture_default_str();
}

std::vector<Device> choose_devices(const DeviceFlags& f, bool print_note) {
  detail::set_gemm(f.gemm);
  std::vector<Device> devices;
  if (!f.devices.empty()) {
    devices = parse_devices(f.devices);
    for (auto& d : devices) runtime(d);  // unknown or unbuilt backends fail here with one line
  } else {
    DeviceChoice c = resolve_num_gpus(f.num_gpus, num_gpus());
    if (print_note && !c.note.empty()) std::cout << c.note << "\n";
    devices = c.devices;
  }
  use_devices(devices);
  return devices;
}

void require_positive(const char* flag, double value) {
  if (!(value > 0)) {
    std::ostringstream os;
    os << "bad " << flag << " " << value << ": expected a number > 0";
    throw ConfigError(os.str());
  }
}

static std::string one_line(std::string s) {
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

int guarded_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "error: " << one_line(e.what()) << " (see --help)\n";
    return 2;
  }
  try {
    return body();
  } catch (const ConfigError& e) {
    std::cerr << "error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::invalid_argument& e) {  // ShapeError, bad sizes
    std::cerr << "error: " << one_line(e.what()) << "\n";
    return 2;
  } catch (const std::exception& e) {  // DeviceError, data errors, I/O
    std::cerr << "error: " << one_line(e.what()) << "\n";
    return 1;
  }
}

}  // namespace d2l
