// Which OpenBLAS build is loaded (docs/thread-budget.md, "OpenBLAS"). The project links the pthreads build and
// pins it to one thread per call: each device thread runs a 1-thread sgemm on its own block, and
// the device threads give the parallelism. Debian's alternatives can swap in another build at run
// time: the OpenMP one is pinned the same way; the serial one is not thread-safe (its buffer pool
// has no lock), so with it gemm.cpp serialises the calls and a note says so.
#include <cblas.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <strings.h>
#include <mutex>

#include "kernels/cpu/kernels.hpp"

namespace d2l::kernels::cpu {

static std::atomic<bool> serialised{false};

int blas_parallel_mode() { return openblas_get_parallel(); }  // 0 serial, 1 pthreads, 2 OpenMP

// OpenBLAS's kernel set (openblas_get_corename: what it detected, or OPENBLAS_CORETYPE) by its vector
// registers: AVX-512 sets 16 floats, AVX and AVX2 sets 8, the SSE sets (Prescott, Core2, Nehalem,
// Atom, Opteron, ..., and what an unknown CPU falls back to) 4.
int blas_vector_floats() {
  const char* core = openblas_get_corename();
  if (!core) return 4;
  for (const char* wide : {"skylakex", "cooperlake", "sapphirerapids"})
    if (strcasecmp(core, wide) == 0) return 16;
  for (const char* avx : {"sandybridge", "haswell", "zen", "bulldozer", "piledriver", "steamroller", "excavator"})
    if (strcasecmp(core, avx) == 0) return 8;
  return 4;
}
const char* blas_core_name() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

bool blas_serialised() { return serialised.load(std::memory_order_relaxed); }

void check_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (openblas_get_parallel() == 0) {
      serialised = true;
      std::fprintf(stderr, "note: the serial OpenBLAS build is loaded; it is not thread-safe, so GEMM calls of "
                           "different devices take turns (install libopenblas0-pthread for overlap)\n");
    } else {
      openblas_set_num_threads(1);
    }
  });
}

}  // namespace d2l::kernels::cpu
