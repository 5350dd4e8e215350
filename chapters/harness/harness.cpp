#include "chapters/harness/harness.hpp"

#include <algorithm>
#include <cstdio>

#include "core/cli.hpp"
#include "core/runtime.hpp"
#include "core/trace.hpp"

namespace d2l::harness {

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
}

}  // namespace d2l::harness
