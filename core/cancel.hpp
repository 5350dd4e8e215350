// Stopping a run (Ctrl-C, SIGTERM): one flag every floor reads, so it lives at the bottom: the
// streams skip their queued work (core/stream.hpp), the host reads throw, and no file is written.
#pragma once
#include <stdexcept>

namespace d2l {

// A run that stops (Ctrl-C, SIGTERM) must not first run everything it queued: a CPU device's queue can
// hold seconds of convolutions. After this call every stream skips the work tasks (enqueue()) it has
// not started; events and waits still complete, so a host blocked in item() or waitall() goes on as
// soon as the running kernels end, and there gets WorkCancelled instead of values. Nothing computed afterwards is valid: the signal handler
// (core/cli.hpp) calls this, the process is about to exit, and no file is written any more
// (io::write_file_atomic and the plots refuse once work_cancelled()). Async-signal-safe.
void cancel_queued_work();
bool work_cancelled();

// What a host read (copy_to_host, item(), to_vector()) or waitall() throws once work was cancelled:
// the values may come from skipped kernels, so nobody gets to compute with them.
struct WorkCancelled : std::runtime_error {
  WorkCancelled() : std::runtime_error("queued work was cancelled (the run is stopping)") {}
};

}  // namespace d2l
