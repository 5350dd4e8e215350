// The process group (README.md "Processes and machines (MPI)"): one process per device group, started by
// mpirun. Each process knows its rank, the world size and its local rank (its place among the
// processes on the same host). Without mpirun a program is a world of one and behaves exactly as
// a program of chapters 1-3: no MPI is started at all.
//
// Every MPI call of a process runs on one communication thread (the `comm` stream below), so the
// library is only asked for MPI_THREAD_FUNNELED. Its tasks wait with MPI_Test in a loop rather than
// blocking, so that an abort requested by any thread (an error, Ctrl-C) is carried out within
// milliseconds even while a collective waits for a rank that will never come.
#pragma once
#include <functional>
#include <string>

#include "core/device.hpp"
#include "core/stream.hpp"
#include "core/world.hpp"

namespace d2l::dist {

// An error every rank raises at the same point of the program, knowing the same facts (a
// configuration mismatch found by an exchange): rank 0 alone prints it and every rank exits with
// exit code 2 after a normal MPI_Finalize. Any other error is one rank's own: it prints
// "error: rank r: ..." and abort() takes the whole world down.
struct CollectiveError : ConfigError {
  using ConfigError::ConfigError;
};

// Whether this build can talk MPI (Meson found libopenmpi-dev).
bool built_with_mpi();

// Starts MPI on the communication thread when the world has more than one process (idempotent).
// A build without MPI started as one of several processes: ConfigError, one line.
void init();
bool initialized();
// Waits for the communication thread, then MPI_Finalize (idempotent; nothing when not initialized).
void finalize();
// Ends every process of the world with `code` (MPI_Abort, from the communication thread) after
// the caller has printed its line. Without MPI: std::_Exit(code).
[[noreturn]] void abort(int code);

// The communication thread as a stream: fn runs after everything enqueued before it, and may call
// MPI. init() must have run. Errors inside fn come back at the next synchronize.
Stream& comm();

// The communication thread, and the GPUs' communication streams (core/dist/nccl.cpp), are registered
// with the runtime (add_comm_stream, core/runtime.hpp): waitall() waits for them too.

// Inside a comm task: completes an MPI request by polling, abandoning it for an abort requested
// meanwhile. `request` is an MPI_Request* (kept opaque so this header needs no mpi.h).
void wait_request(void* request);

}  // namespace d2l::dist
