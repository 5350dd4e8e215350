// One timeline for all ranks. Each rank started its trace clock right after a barrier, so the
// clocks agree to within the barrier's exit skew (microseconds over shared memory); each rank sends
// its records as text to rank 0, which writes one Chrome-trace JSON: a process per rank (pid = rank,
// named "rank r"), a thread per device stream ("cpu(0) compute", "cpu(0) copy", "cpu(0) comm": the
// communication thread of that rank). Bucket allreduces carry their label ("bucket 3 (4.72 MB)").
// Chapter 4's DDP step and chapter 5's ZeRO-3 step over the ranks write theirs with it.
#include <cstdio>
#include <map>
#include <sstream>

#include "chapters/harness/harness.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/io/atomic_file.hpp"

namespace d2l::harness {

namespace {

// Fields separated by tabs, records by newlines (labels and op names hold neither).
std::string encode_records(const std::vector<trace::Record>& events) {
  std::ostringstream out;
  for (auto& e : events) {
    char times[64];
    std::snprintf(times, sizeof times, "%.3f\t%.3f", e.start_us, e.end_us);
    out << e.device.str() << ' ' << e.stream << '\t' << (e.label.empty() ? e.name : e.label) << '\t' << e.name << '\t'
        << times << '\n';
  }
  return out.str();
}

std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
  }
  return out + "\"";
}

}  // namespace

void write_timeline(const std::string& path, const std::vector<trace::Record>& mine) {
  const std::vector<std::string> all = dist::gather_strings(encode_records(mine));
  if (dist::rank() != 0) return;
  std::string json = "{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n";
  bool first = true;
  auto add = [&](const std::string& event) {
    json += (first ? "" : ",\n") + event;
    first = false;
  };
  for (size_t r = 0; r < all.size(); ++r) {
    const std::string pid = std::to_string(r);
    add("{\"ph\": \"M\", \"name\": \"process_name\", \"pid\": " + pid + ", \"tid\": 0, \"args\": {\"name\": \"rank " +
        pid + "\"}}");
    std::map<std::string, int> tid;  // lane -> thread id, in order of appearance
    std::istringstream in(all[r]);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string lane, name, op, start, end;
      std::getline(f, lane, '\t');
      std::getline(f, name, '\t');
      std::getline(f, op, '\t');
      std::getline(f, start, '\t');
      std::getline(f, end, '\t');
      auto [it, fresh] = tid.emplace(lane, static_cast<int>(tid.size()) + 1);
      const std::string t = std::to_string(it->second);
      if (fresh)
        add("{\"ph\": \"M\", \"name\": \"thread_name\", \"pid\": " + pid + ", \"tid\": " + t + ", \"args\": {\"name\": " +
            json_string(lane) + "}}");
      const double dur = std::max(0.0, std::stod(end) - std::stod(start));
      char ts[64];
      std::snprintf(ts, sizeof ts, "\"ts\": %s, \"dur\": %.3f", start.c_str(), dur);
      add("{\"ph\": \"X\", \"name\": " + json_string(name) + ", \"cat\": " + json_string(lane) + ", \"pid\": " + pid +
          ", \"tid\": " + t + ", " + ts + ", \"args\": {\"op\": " + json_string(op) + "}}");
    }
  }
  json += "\n]}\n";
  io::write_file_atomic(path, {json});
}

}  // namespace d2l::harness
