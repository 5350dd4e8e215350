#include "core/trace.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <stdexcept>

#include "core/io/atomic_file.hpp"

namespace d2l::trace {

// ---- recording -------------------------------------------------------------------------------

namespace {
std::atomic<bool> g_on{false};            // read by every enqueue: the only cost when off
std::atomic<uint64_t> g_generation{0};    // which recording a captured task belongs to

struct Store {
  std::mutex mu;
  std::vector<Record> records;
  Clock::time_point origin;  // t = 0 of the current recording
  size_t max_records = 0;
  bool full = false;
};
Store& store() {
  static Store s;
  return s;
}

thread_local std::string t_label;  // the innermost Label of this thread
thread_local std::optional<int64_t> t_tag;

double us_between(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double, std::micro>(to - from).count();
}
}  // namespace

void start(size_t max_records) {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  s.records.clear();
  s.origin = Clock::now();
  s.max_records = max_records;
  s.full = max_records == 0;
  g_generation.fetch_add(1);  // tasks captured by an earlier recording are dropped in finish()
  g_on.store(max_records > 0, std::memory_order_relaxed);
}

void stop() { g_on.store(false, std::memory_order_relaxed); }
bool recording() { return g_on.load(std::memory_order_relaxed); }

bool full() {
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.full;
}

std::vector<Record> events() {
  std::vector<Record> out;
  {
    Store& s = store();
    std::lock_guard<std::mutex> lock(s.mu);
    out = s.records;
  }
  std::stable_sort(out.begin(), out.end(), [](const Record& a, const Record& b) { return a.start_us < b.start_us; });
  return out;
}

Label::Label(std::string text, std::optional<int64_t> tag) : prev_text_(std::move(t_label)), prev_tag_(t_tag) {
  t_label = std::move(text);
  t_tag = tag;
}

Label::~Label() {
  t_label = std::move(prev_text_);
  t_tag = prev_tag_;
}

Lane lane_of(const std::string& stream_name) {
  size_t space = stream_name.rfind(' ');
  if (space == std::string::npos) return {};
  try {
    return Lane{parse_device(stream_name.substr(0, space)), stream_name.substr(space + 1), true};
  } catch (const ConfigError&) {
    return {};  // not a device's stream: never traced
  }
}

std::unique_ptr<Pending> capture() {
  if (!g_on.load(std::memory_order_relaxed)) return nullptr;
  return std::make_unique<Pending>(Pending{t_label, t_tag, g_generation.load()});
}

void finish(const Lane& lane, const char* op, const Pending& p, Clock::time_point start, Clock::time_point end) {
  if (!lane.valid) return;
  Store& s = store();
  std::lock_guard<std::mutex> lock(s.mu);
  if (p.generation != g_generation.load() || s.full) return;
  s.records.push_back(Record{lane.device, lane.stream, op, p.label, us_between(s.origin, start),
                             us_between(s.origin, end), p.tag});
  if (s.records.size() >= s.max_records) {
    s.full = true;
    g_on.store(false, std::memory_order_relaxed);
  }
}

// ---- idle fractions --------------------------------------------------------------------------

// Length of the union of intervals [a, b).
static double union_length(std::vector<std::pair<double, double>> iv) {
  std::sort(iv.begin(), iv.end());
  double total = 0, a = 0, b = 0;
  bool open = false;
  for (auto [x, y] : iv) {
    if (open && x <= b) {
      b = std::max(b, y);
      continue;
    }
    if (open) total += b - a;
    a = x, b = y, open = true;
  }
  return open ? total + (b - a) : total;
}

static double busy_us(const std::vector<Record>& events, Device device, double t0, double t1) {
  std::vector<std::pair<double, double>> iv;
  for (auto& e : events) {
    if (e.device != device || e.stream != "compute") continue;
    double a = std::max(e.start_us, t0), b = std::min(e.end_us, t1);
    if (b > a) iv.emplace_back(a, b);
  }
  return union_length(std::move(iv));
}

double idle_fraction(const std::vector<Record>& events, Device device, double t0_us, double t1_us) {
  if (!(t1_us > t0_us))
    throw std::invalid_argument("idle_fraction: empty window [" + std::to_string(t0_us) + ", " +
                                std::to_string(t1_us) + "] us");
  return 1.0 - busy_us(events, device, t0_us, t1_us) / (t1_us - t0_us);
}

std::vector<DeviceSummary> summarize(const std::vector<Record>& events) {
  if (events.empty()) return {};
  double t0 = events[0].start_us, t1 = events[0].end_us;
  std::map<Device, DeviceSummary> by_device;
  for (auto& e : events) {
    t0 = std::min(t0, e.start_us);
    t1 = std::max(t1, e.end_us);
    DeviceSummary& d = by_device[e.device];
    d.device = e.device;
    (e.stream == "compute" ? d.compute_tasks : d.copy_tasks) += 1;
  }
  std::vector<DeviceSummary> out;
  for (auto& [dev, d] : by_device) {
    d.busy_us = busy_us(events, dev, t0, t1);
    d.idle_fraction = t1 > t0 ? idle_fraction(events, dev, t0, t1) : 1.0;
    out.push_back(d);
  }
  return out;
}

std::string idle_line(const std::vector<DeviceSummary>& summary) {
  std::string s;
  for (auto& d : summary) {
    char buf[32];
    std::snprintf(buf, sizeof buf, " %.2f", d.idle_fraction);
    s += (s.empty() ? "" : ", ") + d.device.str() + buf;
  }
  return s;
}

// ---- time by kind of op ------------------------------------------------------------------------

OpTimes op_times(const std::vector<Record>& events) {
  static const char* const kOptimizerOps[] = {"sgd_update", "adam_update", "multi_sgd_mom_update",
                                              "multi_adam_update", "add_", "scale_"};
  auto starts_with = [](const std::string& s, const char* prefix) { return s.rfind(prefix, 0) == 0; };
  OpTimes t;
  for (auto& e : events) {
    if (e.stream != "compute") continue;
    const double ms = (e.end_us - e.start_us) * 1e-3;
    if (starts_with(e.name, "conv2d"))
      t.convolutions_ms += ms;
    else if (starts_with(e.name, "batch_norm"))
      t.batch_norm_ms += ms;
    else if (std::find(std::begin(kOptimizerOps), std::end(kOptimizerOps), e.name) != std::end(kOptimizerOps))
      t.optimizer_ms += ms;
    else
      t.other_ms += ms;
  }
  return t;
}

std::string op_times_line(const OpTimes& t) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "convolutions %.1f, batch_norm %.1f, optimizer %.1f, other %.1f", t.convolutions_ms,
                t.batch_norm_ms, t.optimizer_ms, t.other_ms);
  return buf;
}

// ---- Chrome-trace JSON -----------------------------------------------------------------------

void check_writable(const std::string& path) {
  if (path.empty()) throw ConfigError("cannot write the trace: the file name is empty");
  std::string why = io::why_not_writable(path);
  if (!why.empty()) throw ConfigError("cannot write the trace '" + path + "': " + why);
}

static void append_json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += '"';
}

static std::string num(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.3f", x);
  return buf;
}

// The whole document: metadata naming each device's process and stream lanes, then one complete
// event per record. pid = 1, 2, ... in Device order; tid 1 = compute, 2 = copy, others after.
static std::string chrome_json(const std::vector<Record>& events) {
  std::map<Device, int> pid;
  std::map<std::string, int> tid{{"compute", 1}, {"copy", 2}};
  for (auto& e : events) {
    pid.emplace(e.device, 0);
    tid.emplace(e.stream, static_cast<int>(tid.size()) + 1);
  }
  int next = 1;
  for (auto& [d, p] : pid) p = next++;
  std::string out = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto begin_event = [&] {
    out += first ? "" : ",\n";
    first = false;
  };
  for (auto& [d, p] : pid) {
    begin_event();
    out += "{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " + std::to_string(p) +
           ", \"tid\": 0, \"args\": {\"name\": \"" + d.str() + "\"}},\n";
    out += "{\"ph\": \"M\", \"name\": \"process_sort_index\", \"pid\": " + std::to_string(p) +
           ", \"tid\": 0, \"args\": {\"sort_index\": " + std::to_string(p) + "}}";
    for (auto& [name, t] : tid) {
      out += ",\n{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " + std::to_string(p) +
             ", \"tid\": " + std::to_string(t) + ", \"args\": {\"name\": ";
      append_json_string(out, name);
      out += "}},\n{\"ph\": \"M\", \"name\": \"thread_sort_index\", \"pid\": " + std::to_string(p) +
             ", \"tid\": " + std::to_string(t) + ", \"args\": {\"sort_index\": " + std::to_string(t) + "}}";
    }
  }
  for (auto& e : events) {
    begin_event();
    out += "{\"ph\": \"X\", \"name\": ";
    append_json_string(out, e.label.empty() ? e.name : e.label);
    out += ", \"cat\": ";
    append_json_string(out, e.stream);
    out += ", \"pid\": " + std::to_string(pid[e.device]) + ", \"tid\": " + std::to_string(tid[e.stream]) +
           ", \"ts\": " + num(e.start_us) + ", \"dur\": " + num(std::max(0.0, e.end_us - e.start_us)) +
           ", \"args\": {\"op\": ";
    append_json_string(out, e.name);
    if (!e.label.empty()) {
      out += ", \"label\": ";
      append_json_string(out, e.label);
    }
    if (e.tag) out += ", \"tag\": " + std::to_string(*e.tag);
    out += "}}";
  }
  out += "\n]}\n";
  return out;
}

void write_chrome_json(const std::string& path, const std::vector<Record>& events) {
  check_writable(path);
  std::string text = chrome_json(events);
  try {
    io::write_file_atomic(path, {text});  // a temporary file in the same directory, renamed over `path`
  } catch (const io::FileError& e) {
    throw std::runtime_error(std::string("writing the trace: ") + e.what());
  }
}

}  // namespace d2l::trace
