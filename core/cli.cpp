#include "core/cli.hpp"

#include <CLI/CLI.hpp>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include "core/dist/process_group.hpp"
#include "core/io/atomic_file.hpp"
#include "core/ops/op.hpp"
#include "kernels/cpu/kernels.hpp"
#include "core/parameter.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"

namespace d2l {

void add_device_flags(CLI::App& app, DeviceFlags& f) {
  app.add_option("--num-gpus", f.num_gpus,
                 "number of GPUs to train on; CPU devices stand in when the machine has no GPU")
      ->capture_default_str();
  app.add_option("--devices", f.devices, "explicit device list, e.g. cpu:0,cpu:1, gpu:0,gpu:1 or emu:0,emu:1 (overrides --num-gpus)");
  app.add_option("--gemm", f.gemm,
                 "the GEMM: auto (cuBLAS on GPUs, a member per shape on CPUs); on GPUs cublas, tiled, regblock, warptiled, tf32 or mma "
                 "(hand-written CUDA kernels; tf32 on tensor cores, sm_80+); on CPUs openblas, packed or blocked (kernels/cpu); naive on both")
      ->capture_default_str();
}

std::vector<Device> choose_devices(const DeviceFlags& f, bool print_note) {
  detail::set_gemm(f.gemm);
  static std::atomic<bool> told{false};  // once a process: the CPU GEMM that runs, and its vector width
  if (print_note && !told.exchange(true)) std::cout << kernels::cpu::gemm_description() << "\n";
  // The physical GPUs, D2L_LOGICAL_GPUS and a GPU listed twice decide the logical GPUs (core/device.hpp).
  if (f.devices.empty() && f.num_gpus > 0 && num_gpus() == 0)
    require_at_most("--num-gpus", f.num_gpus, max_cpu_devices(), "CPU devices (threads)");
  DevicePlan plan;
  try {
    if (!f.devices.empty())  // a kind whose backend is not built says so first
      for (auto& d : parse_devices(f.devices, true))
        if (!backend_built(d.kind)) runtime(d);
    plan = plan_devices(f.devices, f.num_gpus, std::getenv("D2L_LOGICAL_GPUS"), num_physical_gpus());
    set_gpu_map(plan.gpu_map);
    if (!f.devices.empty())
      for (auto& d : plan.devices) runtime(d);  // unknown or unbuilt backends fail here with one line
  } catch (const std::exception& e) {
    if (f.devices.empty()) throw;
    throw ConfigError("bad --devices " + f.devices + ": " + e.what());
  }
  if (print_note)
    for (const std::string& note : plan.notes) std::cout << note << "\n";
  std::vector<Device> devices = plan.devices;
  use_devices(devices);
  return devices;
}

std::string bad_value(const char* flag, double value, const std::string& why) {
  std::ostringstream os;
  os.precision(15);  // whole sizes in full: "bad --num-classes 1000000000"
  os << "bad " << flag << " " << value << ": " << why;
  return os.str();
}

void require_positive(const char* flag, double value) {
  if (!(value > 0) || !std::isfinite(value)) throw ConfigError(bad_value(flag, value, "expected a finite number > 0"));
}

void require_finite(const char* flag, double value) {
  if (!std::isfinite(value)) throw ConfigError(bad_value(flag, value, "expected a finite number"));
}

void require_at_most(const char* flag, double value, double limit, const std::string& what) {
  if (!(value <= limit)) {
    std::ostringstream os;
    os << "this machine provides at most " << limit << " " << what;
    throw ConfigError(bad_value(flag, value, os.str()));
  }
}

double physical_memory_bytes() {
  long pages = ::sysconf(_SC_PHYS_PAGES), size = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0;
}

static std::string memory_shortfall(double bytes) {
  double have = physical_memory_bytes();
  if (have <= 0 || bytes <= have) return "";
  std::ostringstream os;
  os.precision(3);
  os << "needs " << bytes / 1e9 << " GB of memory; this machine has " << have / 1e9 << " GB";
  return os.str();
}

void require_memory(const char* flag, double value, double bytes) {
  std::string why = memory_shortfall(bytes);
  if (!why.empty()) throw ConfigError(bad_value(flag, value, why));
}

void require_memory_of(const std::string& flags, double bytes) {
  std::string why = memory_shortfall(bytes);
  if (!why.empty()) throw ConfigError("bad " + flags + ": " + why);
}

int max_cpu_devices() {
  double threads = 1e9;
  struct rlimit rl {};
  if (::getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) threads = static_cast<double>(rl.rlim_cur);
  std::ifstream max_file("/proc/sys/kernel/threads-max");
  double sys = 0;
  if (max_file >> sys && sys > 0) threads = std::min(threads, sys);
  return static_cast<int>(std::max(1.0, std::min(256.0, threads / 4)));
}

std::vector<double> parse_list(const char* flag, const std::string& text, bool distinct) {
  auto fail = [&](const std::string& why) { return ConfigError(std::string("bad ") + flag + " '" + text + "': " + why); };
  std::vector<double> out;
  std::vector<std::string> items;
  size_t start = 0;
  for (;;) {
    size_t comma = text.find(',', start);
    items.push_back(text.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    const std::string nth = "item " + std::to_string(i + 1);
    if (item.empty()) throw fail(text.empty() ? "the list is empty" : nth + " is empty");
    char* end = nullptr;
    errno = 0;
    double v = std::strtod(item.c_str(), &end);
    if (end != item.c_str() + item.size() || item.find_first_of(" \t") != std::string::npos || errno == ERANGE || !std::isfinite(v))
      throw fail(nth + " ('" + item + "') is not a finite number");
    if (distinct)
      for (size_t j = 0; j < out.size(); ++j)
        if (out[j] == v) throw fail(nth + " repeats item " + std::to_string(j + 1) + " (" + item + ")");
    out.push_back(v);
  }
  return out;
}

std::vector<int64_t> parse_int_list(const char* flag, const std::string& text, bool distinct) {
  std::vector<int64_t> out;
  std::vector<double> v = parse_list(flag, text, distinct);
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] != std::floor(v[i]) || std::fabs(v[i]) > 9e15)
      throw ConfigError(std::string("bad ") + flag + " '" + text + "': item " + std::to_string(i + 1) + " is not a whole number");
    out.push_back(static_cast<int64_t>(v[i]));
  }
  return out;
}

void check_output_path(const char* flag, const std::string& path) {
  if (path.empty()) return;
  std::string why = io::why_not_writable(path);
  if (!why.empty()) throw ConfigError(std::string("bad ") + flag + " " + path + ": " + why);
}

void check_output_dir(const char* flag, const std::string& dir, const std::vector<std::string>& names) {
  if (dir.empty()) return;
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    throw ConfigError(std::string("bad ") + flag + " '" + dir + "': not a directory ('' for none)");
  for (const std::string& name : names) {
    std::string why = io::why_not_writable(dir + "/" + name);
    if (!why.empty()) throw ConfigError(std::string("bad ") + flag + " '" + dir + "': " + name + ": " + why);
  }
}

// ---- Interruption: the handler only stores the signal (async-signal-safe).
static std::atomic<int> g_signal{0};

static void on_signal(int sig) {
  if (g_signal.exchange(sig) != 0) ::_exit(128 + sig);  // a second signal: stop now
  cancel_queued_work();  // the queued kernels are skipped: a host waiting on them goes on at once
}

void install_interrupt_handlers() {
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
}

bool interrupted() { return g_signal.load(std::memory_order_relaxed) != 0; }
int interrupt_signal() { return g_signal.load(std::memory_order_relaxed); }

Interrupted::Interrupted(int sig)
    : std::runtime_error(std::string("interrupted by ") + (sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal")),
      signal(sig) {}

void check_interrupt() {
  if (int sig = interrupt_signal()) throw Interrupted(sig);
}

int exit_interrupted(const Interrupted& e) {
  try {
    cancel_queued_work();  // (done by the handler already) queued kernels are skipped
    waitall();              // the running ones end before their buffers go away
  } catch (const std::exception&) {
  }
  std::cerr << e.what() << "; stopped\n";
  return 128 + e.signal;
}

void check_loss(double loss, int epoch, int64_t step) {
  check_interrupt();  // a loss read after Ctrl-C may come from skipped work (cancel_queued_work)
  if (std::isfinite(loss)) return;
  std::ostringstream os;
  os << "training diverged: loss " << loss << " at epoch " << epoch << ", step " << step << " (try a smaller --lr)";
  throw DivergedError(os.str());
}

void check_loss(double loss, bool stepped, int epoch, int64_t step) {
  if (stepped || std::isfinite(loss)) check_loss(loss, epoch, step);
}

static std::string one_line(std::string s) {
  for (auto& c : s)
    if (c == '\n') c = ' ';
  return s;
}

// One write(2) per line: an aborting rank's line must not be cut by what another process (Open
// MPI's own abort notice) writes to the same stderr meanwhile, as separate `<<` writes can be.
static void print_error_line(const std::string& text) {
  std::string line = text + "\n";
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(2, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

// In a world of several processes an error is either every rank's (CollectiveError: rank 0 prints
// it, all exit normally with code 2) or one rank's own: it prints "error: rank r: ..." and takes
// every rank down (dist::abort), so no rank waits forever in a collective.
static int fail(const std::string& line, int code) {
  if (dist::world_size() == 1) {
    print_error_line("error: " + line);
    return code;
  }
  print_error_line("error: rank " + std::to_string(dist::rank()) + ": " + line);
  dist::abort(code);
}

int guarded_main(CLI::App& app, int argc, char** argv, const std::function<int()>& body) {
  try {
    dist::init();  // under mpirun: MPI starts on the communication thread; alone: nothing
    // One voice: rank 0 alone prints results (every rank's errors still reach stderr).
    if (dist::rank() > 0 && !std::freopen("/dev/null", "w", stdout)) throw ConfigError("cannot silence rank " + std::to_string(dist::rank()));
    app.parse(argc, argv);
    // The environment is checked like a flag.
    if (std::string why = why_num_threads_env_is_bad(); !why.empty()) throw ConfigError(why);
    if (std::string why = why_logical_gpus_env_is_bad(); !why.empty()) throw ConfigError(why);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return fail(one_line(e.what()) + " (see --help)", 2);
  } catch (const ConfigError& e) {
    return fail(one_line(e.what()), 2);
  }
  try {
    int code = body();
    dist::finalize();
    return code;
  } catch (const Interrupted& e) {
    int code = exit_interrupted(e);
    if (dist::world_size() > 1) dist::abort(code);  // the other ranks may be waiting in a collective
    return code;
  } catch (const dist::CollectiveError& e) {
    if (dist::rank() == 0) print_error_line("error: " + one_line(e.what()));
    dist::finalize();
    return 2;
  } catch (const std::exception& e) {
    // After a signal, values computed by skipped work (cancel_queued_work) may have raised another
    // error first: the run was interrupted all the same.
    if (interrupted()) return exit_interrupted(Interrupted(interrupt_signal()));
    if (dynamic_cast<const ConfigError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e))  // bad input, ShapeError
      return fail(one_line(e.what()), 2);
    return fail(one_line(e.what()), 1);  // DeviceError, data errors, I/O
  }
}

}  // namespace d2l
