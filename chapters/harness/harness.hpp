// What the chapter programs repeat around the book's code, written once: the --trace flags. A
// program adds them, checks them with its other flags, starts the recording before its work and
// finishes after it:
//
//   harness::Trace trace;
//   trace.add_flags(app);            // --trace FILE, --trace-tasks N
//   ... trace.check();               // bad values: one line naming the flag, before any work
//   trace.start();  train(cfg);  trace.finish();
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>

namespace d2l::harness {

struct Trace {
  std::string file;       // --trace: Chrome-trace JSON of every stream task ('' for none)
  int64_t tasks = 20000;  // --trace-tasks: at most this many tasks, the start of the run

  void add_flags(CLI::App& app);
  void check() const;   // ConfigError naming --trace or --trace-tasks; the file proven writable
  void start() const;   // trace::start, when --trace was given
  // When --trace was given: waits for every device, writes the file and prints
  //   trace: N stream tasks over T s written to FILE
  //   idle fraction of the compute streams: cpu(0) 12%, ...
  void finish() const;
};

}  // namespace d2l::harness
