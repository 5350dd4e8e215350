// Flag helpers shared by the chapter programs: device selection with the book's names, and a main()
// guard that turns any error into one line on stderr and a non-zero exit.
#pragma once
#include <cstdint>
#include <functional>
#include <stdexcept>
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

// Flag range checks after parsing: ConfigError "bad --lr -1: expected a finite number > 0".
// NaN and the infinities are rejected by both.
void require_positive(const char* flag, double value);
void require_finite(const char* flag, double value);  // "bad --wd inf: expected a finite number"
// A count checked against what the machine provides: ConfigError
// "bad --num-gpus 5000: this machine can run at most 256 CPU devices (threads)".
void require_at_most(const char* flag, double value, double limit, const std::string& what);
// A size whose buffers need `bytes`: ConfigError naming the flag, the value, the bytes and the
// machine's physical memory when they do not fit.
void require_memory(const char* flag, double value, double bytes);
double physical_memory_bytes();
// CPU devices the machine can start: each runs two stream threads and a share of the cores; bounded
// by 256 and by the process's thread limit (RLIMIT_NPROC, /proc/sys/kernel/threads-max) / 4.
int max_cpu_devices();

// An output file (plot, trace, checkpoint, parameters) checked before the work starts: ConfigError
// "bad --plot /no/dir/a.png: directory '/no/dir' does not exist" unless a file can be created there.
// An empty path means "no output" and passes.
void check_output_path(const char* flag, const std::string& path);

// Interruption: install_interrupt_handlers() makes SIGINT and SIGTERM set a flag (and nothing else)
// that long loops poll with interrupted() or check_interrupt(); guarded_main then waits for the
// devices, lets destructors clean up and exits 128 + signal (130 for SIGINT, 143 for SIGTERM).
// A second signal while stopping ends the process at once with the same code.
void install_interrupt_handlers();
bool interrupted();
int interrupt_signal();  // the signal received, 0 if none
struct Interrupted : std::runtime_error {
  explicit Interrupted(int signal);
  int signal;
};
void check_interrupt();  // throws Interrupted once a signal arrived
// The exit code for an interrupted run, after waiting for the devices: 128 + signal.
int exit_interrupted(const Interrupted& e);

// Training that diverges: DivergedError "training diverged: loss nan at epoch 3, step 120 (try a
// smaller --lr)" unless the loss is finite. epoch and step count from 1.
struct DivergedError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void check_loss(double loss, int epoch, int64_t step);

// Runs body(); parse errors, bad input and device errors become "error: <one line>" with exit code 2
// (bad flags or input) or 1 (failures while running, divergence). Interrupted: 130/143 (see above).
// --help prints help and exits 0.
int guarded_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace d2l
