// What the chapter programs repeat around the book's code, written once, so that a chapter's train
// shows the book's loop and nothing else:
//
//   Trace        --trace FILE, --trace-tasks N: the devices' timeline as Chrome-trace JSON
//   Conv         --conv NAME: which member of the CPU convolution kernel family runs
//   Progress     the progress line of an epoch on stderr, and the epoch's timer
//   InFlight     how many steps the host enqueues ahead of the one it waits for
//   check_outputs / check_readable   output paths and input files, checked before any work
//   resume / save_checkpoint         --resume and --checkpoint around the epochs
//
// A program adds the flags, checks them with its other flags, then runs:
//
//   harness::Trace trace;  harness::Conv conv;
//   trace.add_flags(app);  conv.add_flags(app);
//   ... trace.check();  conv.apply();   // bad values: one line naming the flag, exit 2, before any work
//   trace.start();  train(cfg);  trace.finish();
#pragma once
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "core/tensor.hpp"
#include "core/trace.hpp"

// CLI11 is declared here, not included: its header alone takes 8 s to compile, and most files that
// use the harness never parse a flag. The programs' main.cpp and harness.cpp include <CLI/CLI.hpp>.
namespace CLI {
class App;
}

namespace d2l {
namespace nn {
class Block;
}
namespace optim {
class Trainer;
}
class DataIter;
}  // namespace d2l

namespace d2l::harness {

// ---- --trace
struct Trace {
  std::string file;       // --trace: Chrome-trace JSON of every stream task ('' for none)
  int64_t tasks = 20000;  // --trace-tasks: at most this many tasks, the start of the run

  void add_flags(CLI::App& app);
  void check() const;   // ConfigError naming --trace or --trace-tasks; the file proven writable
  void start() const;   // trace::start, when --trace was given
  // When --trace was given: waits for every device, writes the file and prints
  //   trace: N stream tasks over T s written to FILE
  //   idle fraction of the compute streams: cpu(0) 12%, ...
  //   compute ms by kind of op: convolutions 812.3, batch_norm 120.4, optimizer 31.0, other 210.5
  //     (trace::op_times: every device's compute-stream tasks summed by kind)
  void finish() const;
};

// ---- --conv: the CPU convolution kernel family (kernels/cpu/conv2d.cpp). The names, one line each
// in harness.cpp's table (conv_kernel_names); "auto", the default, picks one per shape.
// --precision auto|fp32|tf32 (d2l::set_precision, core/kernel_choice.hpp): the arithmetic of the GPU's convolutions and
// GEMMs. tf32: tensor cores with TF32 inputs; fp32: exact FP32; auto: tf32 on real GPUs of compute
// capability 8.0 or more, fp32 on emulated ones. CPU devices always compute in FP32.
// bf16 and fp16, in a chapter whose training loop opens an Autocast scope (mixed): mixed precision,
// the GEMMs and convolutions in bfloat16 or float16 (core/ops.hpp's autocast list), float32 master
// weights, the rest as auto; fp16 with dynamic loss scaling (core/optim/grad_scaler.hpp).
struct Precision {
  std::string name = "auto";
  bool mixed = false;  // set by a chapter that trains under autocast(): bf16 and fp16 are accepted

  void add_flags(CLI::App& app);
  void apply() const;  // ConfigError "bad --precision 'x': expected auto, fp32 or tf32 (or bf16 or fp16)"
  DType autocast() const;  // bf16 / f16 for --precision bf16 / fp16, f32 (no autocast) otherwise
};

// --conv, and with it --precision.
struct Conv {
  std::string name = "auto";
  Precision precision;

  void add_flags(CLI::App& app);
  // Checks the name (ConfigError "bad --conv 'x': expected im2col, auto, direct, winograd, winograd2, blocked or implicit") and selects the
  // member with d2l::set_conv2d_kernel (core/kernel_choice.hpp), for every CPU device of the process.
  void apply() const;
};
std::vector<std::string> conv_kernel_names();  // "im2col", "auto", "direct", "winograd", "winograd2", "blocked", "implicit"

// ---- the progress line of an epoch, on stderr, and the epoch's timer (the book's timer.start()
// and timer.stop()). Style::seconds (chapter 2): "epoch 1: 40/94 minibatches, 3.2 sec", rewritten in
// place on a terminal every 5 minibatches; in a log, a line at every tenth of an epoch of 20+
// minibatches. Style::count (chapter 1): "epoch 1: 40/94 minibatches", on a terminal only, every 10.
// The line is erased on a terminal when the epoch's last minibatch is enqueued. Silent when !show.
class Progress {
 public:
  enum class Style { seconds, count };
  Progress(int epoch, int64_t total, bool show, Style style = Style::seconds);
  void step();                  // one more minibatch enqueued
  double seconds() const;       // since construction
 private:
  int epoch_;
  int64_t total_, done_ = 0;
  bool show_;
  Style style_;
  std::chrono::steady_clock::time_point t0_;
};

// ---- steps in flight: the host enqueues a step while the devices still run the ones before it, and
// waits for the oldest one (`retire` it: read its loss, synchronise its events) before it gets more
// than `n` ahead. Holding the host back bounds the memory the queued work keeps alive.
//
//   InFlight<std::vector<HostValue>> flight(2, [&](auto& reads) { ... check the loss ... });
//   for (batch ...) { flight.wait_for_room(); flight.push(read_later(step(batch))); }
//   flight.drain();
template <class Step>
class InFlight {
 public:
  InFlight(int n, std::function<void(Step&)> retire) : n_(static_cast<size_t>(n < 1 ? 1 : n)), retire_(std::move(retire)) {}
  ~InFlight() = default;
  // Retires the oldest steps until fewer than n are in flight.
  void wait_for_room() {
    while (steps_.size() >= n_) retire_oldest();
  }
  void push(Step s) { steps_.push_back(std::move(s)); }
  // Retires every step, oldest first.
  void drain() {
    while (!steps_.empty()) retire_oldest();
  }
  size_t size() const { return steps_.size(); }

 private:
  void retire_oldest() {
    Step s = std::move(steps_.front());
    steps_.pop_front();
    retire_(s);
  }
  size_t n_;
  std::function<void(Step&)> retire_;
  std::deque<Step> steps_;
};

// ---- what every rank of mpirun must agree on (core/dist/fingerprint.hpp's check_same_config): every
// flag of `app` as this rank parsed it ({"--lr", "0.05"}; a flag not given: its default), in the
// order the flags were added, then the subcommand chosen. Read from the parser itself, so a flag
// added later is in it with no more code. Left out: help, and the flags in `per_rank`, whose values
// may differ between ranks (paths of a rank's own files and directories, --resume whose file each
// rank checks against rank 0's: check_same_checkpoint).
std::vector<std::pair<std::string, std::string>> flag_fingerprint(const CLI::App& app, const std::vector<std::string>& per_rank);

// ---- processes (chapter 1's --dist, chapter 2's dist_sync): this rank's part of a data-parallel
// run over the W processes of mpirun, each with `local` devices. Every rank first checks that all
// agree on `config` (the flags and what follows from them: dist::check_same_config, one line naming
// the first difference), then reads only its devices' shards of every training minibatch
// (shards [rank * local, (rank + 1) * local) of W * local) and its share of the test set.
void join_processes(const std::vector<std::pair<std::string, std::string>>& config, DataIter& train_iter,
                    DataIter& test_iter, int64_t local);

// ---- files: every output path (flag, path; '' = none) proven writable, in order, before any work
// (d2l::check_output_path: ConfigError naming the flag); an input file that exists, is a regular
// file and is readable ("bad --resume 'f': no such file").
void check_outputs(const std::vector<std::pair<const char*, std::string>>& outputs);
void check_readable(const char* flag, const std::string& path);

// ---- checkpoints (core/checkpoint/checkpoint.hpp): --resume before the first epoch, --checkpoint after each.
// resume: "" = none, returns 0; otherwise the epoch the checkpoint was written after, the net and the
// trainer loaded (on `devices`), "resumed from F after epoch E" printed when verbose (with ": nothing
// left to train (--num-epochs)" when E >= num_epochs). A bad file: ConfigError "bad --resume
// checkpoint: <why>".
int resume(const std::string& path, nn::Block& net, optim::Trainer& trainer, const std::vector<Device>& devices,
           int num_epochs, bool verbose);
// Ranks that each resumed from their own file (--resume is a path of the rank's own): every rank's
// epoch and a digest of the parameters it loaded, checked against rank 0's before any collective of
// training, so that a rank holding another epoch's checkpoint is one line ("the ranks' configurations
// differ: rank 1 has checkpoint epoch 1, rank 0 has 2") instead of a rank that waits forever. A
// collective: every rank calls it, after resume().
void check_same_checkpoint(int epoch, const nn::Block& net);
// After `epoch` (1-based) epochs: written atomically when path is not "".
void save_checkpoint(const std::string& path, const nn::Block& net, const optim::Trainer& trainer, int epoch);

// One timeline for all ranks (timeline.cpp): every rank's records (clocks started together after a
// barrier) gathered on rank 0 and written as one Chrome-trace JSON: pid = rank, a thread per device
// stream ("cpu(0) compute", "cpu(0) comm", ...). Collective: every rank calls it.
void write_timeline(const std::string& path, const std::vector<trace::Record>& mine);

}  // namespace d2l::harness
