#include "core/dist/process_group.hpp"

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/device.hpp"
#include "core/runtime.hpp"

#ifdef D2L_WITH_MPI
#include <mpi.h>
#endif

namespace d2l::dist {

namespace {

std::mutex g_mu;
std::unique_ptr<Stream> g_comm;   // the communication thread; made by init()
std::atomic<bool> g_initialized{false}, g_finalized{false};
std::atomic<int> g_abort_code{-1};  // >= 0: an abort was requested
std::thread::id g_comm_thread;       // the thread that makes every MPI call

#ifdef D2L_WITH_MPI
[[noreturn]] void abort_now() {
  MPI_Abort(MPI_COMM_WORLD, g_abort_code.load());
  std::_Exit(g_abort_code.load());
}
#endif

}  // namespace

bool built_with_mpi() {
#ifdef D2L_WITH_MPI
  return true;
#else
  return false;
#endif
}

bool initialized() { return g_initialized.load(); }

void init() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_initialized.load() || world().size == 1) return;
#ifndef D2L_WITH_MPI
  throw ConfigError("started as one of " + std::to_string(world().size) +
                    " processes, but this build has no MPI (install libopenmpi-dev and openmpi-bin, then rebuild)");
#else
  // Named as cpu(0)'s "comm" lane, so --trace shows MPI's work beside the devices' (MPI moves host memory).
  g_comm = std::make_unique<Stream>("cpu(0) comm");
  g_comm->enqueue("MPI_Init", [] {
    g_comm_thread = std::this_thread::get_id();
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    int size = 0, r = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    if (size != world().size || r != world().rank)
      throw ConfigError("MPI reports rank " + std::to_string(r) + " of " + std::to_string(size) +
                        " but the launcher's environment says " + std::to_string(world().rank) + " of " +
                        std::to_string(world().size));
  });
  g_comm->synchronize();
  add_comm_stream(g_comm.get());
  g_initialized = true;
  std::atexit([] { finalize(); });
#endif
}

Stream& comm() {
  if (!g_comm) throw ConfigError("dist::comm(): the process group is not initialized (a world of one has no MPI)");
  return *g_comm;
}

void finalize() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_initialized.load() || g_finalized.exchange(true)) return;
#ifdef D2L_WITH_MPI
  try {
    g_comm->synchronize();
  } catch (...) {
  }
  g_comm->enqueue("MPI_Finalize", [] { MPI_Finalize(); });
  try {
    g_comm->synchronize();
  } catch (...) {
  }
#endif
}

void abort(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
#ifdef D2L_WITH_MPI
  if (g_initialized.load() && !g_finalized.load()) {
    g_abort_code = code;
    if (std::this_thread::get_id() == g_comm_thread) abort_now();  // a failed comm task
    // A waiting collective sees the flag within milliseconds (wait_request); an idle thread runs this.
    g_comm->enqueue("MPI_Abort", [] { abort_now(); });
    std::this_thread::sleep_for(std::chrono::seconds(2));  // MPI_Abort ends this process before
  }
#endif
  std::_Exit(code);
}

void wait_request(void* request) {
#ifdef D2L_WITH_MPI
  auto* req = static_cast<MPI_Request*>(request);
  const auto start = std::chrono::steady_clock::now();
  for (int polls = 0;; ++polls) {
    int done = 0;
    MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (done) return;
    if (g_abort_code.load() >= 0) abort_now();
    // MPI_Test is what moves the data (shared memory has no progress thread): poll, giving way to
    // the devices' threads; after 100 ms of waiting (a slower rank), poll every millisecond.
    if (polls % 64 == 63 && std::chrono::steady_clock::now() - start > std::chrono::milliseconds(100))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    else
      std::this_thread::yield();
  }
#else
  (void)request;
#endif
}

}  // namespace d2l::dist
