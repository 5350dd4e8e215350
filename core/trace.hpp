// A timeline of every stream task (README.md, `--trace`): while recording, each
// task a device's compute or copy stream runs becomes a record {device, stream, name, start, end},
// timed on the stream's own thread by one steady clock, in microseconds since start(). Programs write
// the records as Chrome-trace JSON (Perfetto, chrome://tracing: one process per device, one thread
// lane per stream) and compute each device's idle fraction from the same records.
//
//   trace::start();
//   { trace::Label region("stage 0 fwd", 3); ... enqueue work ... }  // tasks carry the label and tag 3
//   waitall();
//   auto ev = trace::events();
//   trace::write_chrome_json("run.json", ev);
//
// What is a task's time: on cpu(i) and emu(i) the task runs on the stream's thread, so start and end
// are when the kernel ran. On gpu(i) a task only queues work on a CUDA stream; while recording, the
// stream's thread waits for that work after every task, so a record ends when the GPU has finished
// it (the wait removes the launch-ahead, so a traced GPU shows launch gaps and its idle fraction is
// an upper bound). Event records and waits are not tasks of their own: waiting is idle time.
//
// Off by default; when off a stream pays one relaxed atomic load per task.
#pragma once
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.hpp"
#include "kernels/cpu/no_copy.hpp"

namespace d2l::trace {

struct Record {
  Device device;
  std::string stream;  // "compute" or "copy"
  std::string name;    // the op: "conv2d", "copy", "copy from host", ...
  std::string label;   // the trace::Label around the enqueue ("stage 0 fwd"), "" if none
  double start_us = 0, end_us = 0;
  std::optional<int64_t> tag;  // e.g. the micro-batch, from the Label
};

// Starts a new recording (earlier records are discarded; the clock restarts at 0). At most
// max_records tasks are kept: recording stops by itself once that many are in (full() says so).
void start(size_t max_records = std::numeric_limits<size_t>::max());
// Stops recording. Tasks enqueued while recording are still recorded when they run later.
void stop();
bool recording();
bool full();  // the last recording stopped at its max_records
// The records so far, ordered by start time. waitall() first to include every task enqueued.
std::vector<Record> events();

// Names a region of host code: tasks enqueued by this thread while it lives carry `text` (and
// `tag`) in their record. Labels nest; the innermost one wins, the outer one returns at its end.
class Label : NoCopy {
 public:
  explicit Label(std::string text, std::optional<int64_t> tag = std::nullopt);
  ~Label();

 private:
  std::string prev_text_;
  std::optional<int64_t> prev_tag_;
};

// 1 - (time the device's compute stream is busy within [t0_us, t1_us]) / (t1_us - t0_us); tasks
// overlapping each other are counted once. A device without records in the window is idle (1).
// Throws std::invalid_argument when t1_us <= t0_us.
double idle_fraction(const std::vector<Record>& events, Device device, double t0_us, double t1_us);

// Per device of the records (in Device order), over the window from the first start to the last end
// of all records: its compute and copy task counts, compute busy time and idle fraction.
struct DeviceSummary {
  Device device;
  size_t compute_tasks = 0, copy_tasks = 0;
  double busy_us = 0, idle_fraction = 1;
};
std::vector<DeviceSummary> summarize(const std::vector<Record>& events);
// "cpu(0) 0.12, cpu(1) 0.31": each device's idle fraction, for a printed line.
std::string idle_line(const std::vector<DeviceSummary>& summary);

// Compute-stream time by kind of op, summed over every device's tasks (their durations, in ms):
//   convolutions   ops named conv2d*          batch_norm   ops named batch_norm*
//   optimizer      sgd_update, adam_update, multi_sgd_mom_update, multi_adam_update, add_, scale_
//                  (the updates, the gradient sums and SGD's per-tensor momentum kernels)
//   other          everything else (GEMMs, activations, pooling, losses, fills, ...)
struct OpTimes {
  double convolutions_ms = 0, batch_norm_ms = 0, optimizer_ms = 0, other_ms = 0;
};
OpTimes op_times(const std::vector<Record>& events);
// "convolutions 812.3, batch_norm 120.4, optimizer 31.0, other 210.5" (ms), for a printed line.
std::string op_times_line(const OpTimes& t);

// Throws ConfigError (one line naming the path) unless a file can be created at `path`: its
// directory exists and is writable, and the path is not a directory. Call before the work starts.
void check_writable(const std::string& path);
// Chrome trace format: {"traceEvents": [...]}: a complete event ("ph":"X", "ts" and "dur" in us) per
// record, named by its label (or its op when it has none; args hold op, label, tag); "pid" per device
// with process_name "cpu(0)", "tid" 1 = "compute" and 2 = "copy" with thread_name metadata.
// Written to a temporary file in the same directory, then renamed over `path`.
void write_chrome_json(const std::string& path, const std::vector<Record>& events);

// What core/stream.cpp uses: at enqueue, capture() is null unless recording, else it holds the
// label of the enqueueing thread; the stream's thread times the task and hands it to finish().
struct Lane {  // a stream's place in the timeline, from its name "cpu(0) compute"
  Device device;
  std::string stream;
  bool valid = false;
};
Lane lane_of(const std::string& stream_name);
struct Pending {
  std::string label;
  std::optional<int64_t> tag;
  uint64_t generation = 0;  // the recording it belongs to
};
using Clock = std::chrono::steady_clock;
std::unique_ptr<Pending> capture();
void finish(const Lane& lane, const char* op, const Pending& p, Clock::time_point start, Clock::time_point end);

}  // namespace d2l::trace
