// Flag helpers shared by the chapter programs: device selection with the book's names, and a main()
// guard that turns any error into one line on stderr and a non-zero exit.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "core/device.hpp"

namespace CLI {
class App;
}

namespace d2l {

struct DeviceFlags {
  int num_gpus = 1;     // the book's --num-gpus
  std::string devices;  // --devices gpu:0,cpu:1 (overrides --num-gpus)
  std::string gemm = "cublas";  // --gemm: which GEMM GPUs use (emulated GPUs: cublas = the CPU GEMM)
};
void add_device_flags(CLI::App& app, DeviceFlags& f);
// Resolves the flags to devices, prints the --num-gpus note when CPU devices stand in for GPUs,
// and gives the CPU devices their thread budget (use_devices).
std::vector<Device> choose_devices(const DeviceFlags& f, bool print_note = true);

// Flag range checks after parsing: ConfigError "bad --lr -1: expected a number > 0".
void require_positive(const char* flag, double value);

// Runs body(); parse errors, bad input and device errors become "error: <one line>" with exit code 2
// (bad flags or input) or 1 (failures while running). --help prints help and exits 0.
int guarded_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace d2l
