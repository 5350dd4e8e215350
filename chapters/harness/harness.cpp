#include "chapters/harness/harness.hpp"

#include <CLI/CLI.hpp>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "core/cli.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "datasets/data_iter.hpp"
#include "core/nn/block.hpp"
#include "core/checkpoint/checkpoint.hpp"
#include "core/kernel_choice.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

namespace d2l::harness {

// ---- the ranks' fingerprint

std::vector<std::pair<std::string, std::string>> flag_fingerprint(const CLI::App& app, const std::vector<std::string>& per_rank) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const CLI::Option* opt : app.get_options()) {
    const std::string name = opt->get_name();
    if (opt == app.get_help_ptr() || std::find(per_rank.begin(), per_rank.end(), name) != per_rank.end()) continue;
    std::string value;
    if (opt->get_expected_max() == 0) {  // a flag without a value: given or not
      value = opt->count() > 0 ? "on" : "off";
    } else if (opt->count() == 0) {
      value = opt->get_default_str();
    } else {
      for (const std::string& r : opt->results()) value += (value.empty() ? "" : ",") + r;
    }
    out.push_back({name, value});
  }
  for (const CLI::App* sub : app.get_subcommands()) out.push_back({"subcommand", sub->get_name()});
  return out;
}

// ---- processes

void join_processes(const std::vector<std::pair<std::string, std::string>>& config, DataIter& train_iter,
                    DataIter& test_iter, int64_t local) {
  dist::check_same_config(config);
  const int64_t W = dist::world_size(), rank = dist::rank();
  train_iter.shard(W * local, rank * local, (rank + 1) * local);
  test_iter.shard(W, rank, rank + 1);
}

// ---- --trace

void Trace::add_flags(CLI::App& app) {
  app.add_option("--trace", file, "write the devices' timeline to this file as Chrome-trace JSON (Perfetto, chrome://tracing)");
  app.add_option("--trace-tasks", tasks, "--trace records at most this many stream tasks (the start of the run)")
      ->capture_default_str();
}

void Trace::check() const {
  if (file.empty()) return;
  require_positive("--trace-tasks", static_cast<double>(tasks));
  require_memory("--trace-tasks", static_cast<double>(tasks), 256.0 * static_cast<double>(tasks));
  check_output_path("--trace", file);
}

void Trace::start() const {
  if (!file.empty()) trace::start(static_cast<size_t>(tasks));
}

void Trace::finish() const {
  if (file.empty()) return;
  waitall();
  trace::stop();
  auto events = trace::events();
  trace::write_chrome_json(file, events);
  double t0 = events.empty() ? 0 : events.front().start_us, t1 = t0;  // events are ordered by start
  for (auto& e : events) t1 = std::max(t1, e.end_us);
  std::printf("trace: %zu stream tasks over %.2f s written to %s%s\n", events.size(), (t1 - t0) * 1e-6, file.c_str(),
              trace::full() ? " (the first ones: --trace-tasks)" : "");
  std::printf("idle fraction of the compute streams: %s\n", trace::idle_line(trace::summarize(events)).c_str());
  std::printf("compute ms by kind of op: %s\n", trace::op_times_line(trace::op_times(events)).c_str());
}

// ---- --conv

namespace {


// The members of the CPU convolution family a program can ask for: one line per name.
struct ConvName {
  const char* name;
  Conv2dKernel kernel;
};
const ConvName kConvNames[] = {
    {"im2col", Conv2dKernel::im2col},  // the textbook member (kernels/cpu/conv2d.cpp)
    {"auto", Conv2dKernel::automatic},  // a member per shape (conv2d_auto_kernel): the default
    {"direct", Conv2dKernel::direct},
    {"winograd", Conv2dKernel::winograd},
    {"winograd2", Conv2dKernel::winograd2},
    {"blocked", Conv2dKernel::blocked},
    {"implicit", Conv2dKernel::implicit},  // the GPU's kernel5, implicit GEMM (CPU devices run im2col)
};

// "im2col, auto, direct, winograd, winograd2, blocked or implicit"
std::string conv_choices() {
  std::vector<std::string> names = conv_kernel_names();
  std::string s;
  for (size_t i = 0; i < names.size(); ++i) s += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return s;
}

}  // namespace

std::vector<std::string> conv_kernel_names() {
  std::vector<std::string> names;
  for (const ConvName& c : kConvNames) names.push_back(c.name);
  return names;
}

void Precision::add_flags(CLI::App& app) {
  std::string help =
      "the GPU's convolutions and GEMMs: fp32 (exact), tf32 (tensor cores, TF32 inputs, FP32 sums) or auto "
      "(tf32 on GPUs of compute capability 8.0 or more, fp32 on emulated ones); CPUs always compute in FP32";
  if (mixed)
    help += "; bf16 / fp16: mixed precision, the GEMMs and convolutions in bfloat16 / float16 under autocast, float32 "
            "master weights (fp16 with dynamic loss scaling)";
  app.add_option("--precision", name, help)->capture_default_str();
}

void Precision::apply() const {
  if (name == "auto" || (mixed && (name == "bf16" || name == "fp16"))) return set_precision(KernelPrecision::automatic);
  if (name == "fp32") return set_precision(KernelPrecision::fp32);
  if (name == "tf32") return set_precision(KernelPrecision::tf32);
  throw ConfigError("bad --precision '" + name + "': expected " +
                    (mixed ? "auto, fp32, tf32, bf16 or fp16" : "auto, fp32 or tf32 (this program trains in float32 only)"));
}

DType Precision::autocast() const {
  if (!mixed) return DType::f32;
  return name == "bf16" ? DType::bf16 : name == "fp16" ? DType::f16 : DType::f32;
}

void Conv::add_flags(CLI::App& app) {
  app.add_option("--conv", name, "the convolution kernel: " + conv_choices() +
                                     " (auto: a member per shape; GPUs run blocked as im2col)")->capture_default_str();
  precision.add_flags(app);
}

void Conv::apply() const {
  precision.apply();
  for (const ConvName& c : kConvNames)
    if (name == c.name) {
      set_conv2d_kernel(c.kernel);
      return;
    }
  throw ConfigError("bad --conv '" + name + "': expected " + conv_choices());
}

// ---- the progress line

Progress::Progress(int epoch, int64_t total, bool show, Style style)
    : epoch_(epoch), total_(total), show_(show), style_(style), t0_(std::chrono::steady_clock::now()) {}

double Progress::seconds() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
}

void Progress::step() {
  ++done_;
  if (!show_) return;
  static const bool terminal = isatty(2);
  const long long done = done_, total = total_;
  if (style_ == Style::count) {
    if (!terminal || !(done % 10 == 0 || done == total)) return;
    std::fprintf(stderr, "\repoch %d: %lld/%lld minibatches", epoch_, done, total);
    if (done == total) std::fprintf(stderr, "\r%*s\r", 48, "");
  } else if (terminal && (done % 5 == 0 || done == total)) {
    std::fprintf(stderr, "\repoch %d: %lld/%lld minibatches, %.1f sec", epoch_, done, total, seconds());
    if (done == total) std::fprintf(stderr, "\r%*s\r", 60, "");
  } else if (!terminal && total >= 20 && done < total && done % ((total + 9) / 10) == 0) {
    std::fprintf(stderr, "epoch %d: %lld/%lld minibatches, %.1f sec\n", epoch_, done, total, seconds());
  }
  std::fflush(stderr);
}

// ---- files

void check_outputs(const std::vector<std::pair<const char*, std::string>>& outputs) {
  for (const auto& [flag, path] : outputs) check_output_path(flag, path);
}

void check_readable(const char* flag, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(std::string("bad ") + flag + " '" + path + "': no such file");
  if (!S_ISREG(st.st_mode)) throw ConfigError(std::string("bad ") + flag + " '" + path + "': not a regular file");
  if (::access(path.c_str(), R_OK) != 0) throw ConfigError(std::string("bad ") + flag + " '" + path + "': not readable");
}

// ---- checkpoints

int resume(const std::string& path, nn::Block& net, optim::Trainer& trainer, const std::vector<Device>& devices,
           int num_epochs, bool verbose) {
  if (path.empty()) return 0;
  int start = 0;
  try {
    start = static_cast<int>(io::load_checkpoint(path, net, trainer, devices));
  } catch (const std::exception& e) {
    throw ConfigError(std::string("bad --resume checkpoint: ") + e.what());
  }
  check_interrupt();
  if (verbose)
    std::printf("resumed from %s after epoch %d%s\n", path.c_str(), start,
                start >= num_epochs ? ": nothing left to train (--num-epochs)" : "");
  return start;
}

void check_same_checkpoint(int epoch, const nn::Block& net) {
  uint64_t digest = 1469598103934665603ull;  // FNV-1a over every parameter's bytes, in registration order
  for (const auto& [name, p] : net.collect_params()) {
    const std::vector<float> v = p->list_data().at(0).to_vector();
    const auto* bytes = reinterpret_cast<const unsigned char*>(v.data());
    for (size_t i = 0; i < v.size() * sizeof(float); ++i) digest = (digest ^ bytes[i]) * 1099511628211ull;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(digest));
  dist::check_same_config({{"checkpoint epoch", std::to_string(epoch)}, {"checkpoint parameters (digest)", hex}});
}

void save_checkpoint(const std::string& path, const nn::Block& net, const optim::Trainer& trainer, int epoch) {
  if (!path.empty()) io::save_checkpoint(path, net, trainer, epoch);
}

}  // namespace d2l::harness
