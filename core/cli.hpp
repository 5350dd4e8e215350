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
  std::string gemm = "auto";  // --gemm: a member of the GPU's or the CPU's GEMM family (core/ops/gemm.cpp)
};
void add_device_flags(CLI::App& app, DeviceFlags& f);
// Resolves the flags to devices, prints the --num-gpus note when CPU devices stand in for GPUs,
// and gives the CPU devices their thread budget (use_devices).
std::vector<Device> choose_devices(const DeviceFlags& f, bool print_note = true);

// Flag range checks after parsing: ConfigError "bad --lr -1: expected a finite number > 0".
// NaN and the infinities are rejected by both.
void require_positive(const char* flag, double value);
// The message of such errors, the value in full: "bad --sizes-kb 0.001: " + why.
std::string bad_value(const char* flag, double value, const std::string& why);
void require_finite(const char* flag, double value);  // "bad --wd inf: expected a finite number"
// A count checked against what the machine provides: ConfigError
// "bad --num-gpus 5000: this machine can run at most 256 CPU devices (threads)".
void require_at_most(const char* flag, double value, double limit, const std::string& what);
// A size whose buffers need `bytes`: ConfigError naming the flag, the value, the bytes and the
// machine's physical memory when they do not fit.
void require_memory(const char* flag, double value, double bytes);
// The same for sizes that fit alone but not together: "bad --batch-size 64 with --image-size 2048: needs ...".
void require_memory_of(const std::string& flags, double bytes);
double physical_memory_bytes();
// CPU devices the machine can start: each runs two stream threads and a share of the cores; bounded
// by 256 and by the process's thread limit (RLIMIT_NPROC, /proc/sys/kernel/threads-max) / 4.
int max_cpu_devices();

// A comma-separated list flag (--sweep 1,3,5), parsed here rather than by CLI11, which skips empty
// items: "4,,8", "4," and "" are refused, and with `distinct` so is an item given twice ("4,4": a
// sweep or a set of sizes, not per-device weights). ConfigError "bad --sweep '4,,8': item 2 is empty".
std::vector<double> parse_list(const char* flag, const std::string& text, bool distinct);
// The same, every item a whole number ("bad --sweep '4,2.5': item 2 ('2.5') is not a whole number").
std::vector<int64_t> parse_int_list(const char* flag, const std::string& text, bool distinct);

// An output file (plot, trace, checkpoint, parameters) checked before the work starts: ConfigError
// "bad --plot /no/dir/a.png: directory '/no/dir' does not exist" unless the temporary file its
// writer will use can be created there (io::why_not_writable: created and removed, not access(), so
// /proc fails for root too). An empty path means "no output" and passes.
void check_output_path(const char* flag, const std::string& path);
// A directory of outputs (--out-dir) and the files a run will write there, each checked as above:
// "bad --out-dir 'plots': mp_vs_rn.png: it is a directory". An empty dir means "none" and passes.
void check_output_dir(const char* flag, const std::string& dir, const std::vector<std::string>& names);

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
// The same for a step under fp16's loss scaler: a step it skipped (stepped false) may have overflowed
// in its forward, and its loss is not checked.
void check_loss(double loss, bool stepped, int epoch, int64_t step);

// Runs body(); parse errors, bad input and device errors become "error: <one line>" with exit code 2
// (bad flags or input) or 1 (failures while running, divergence). Interrupted: 130/143 (see above).
// --help prints help and exits 0.
int guarded_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body);

}  // namespace d2l
