// Which OpenBLAS build is loaded (DESIGN.md "Kernels"). The project links the serial build: each
// device thread runs a 1-thread sgemm on its own block. Debian's alternatives can swap in the
// pthreads or OpenMP build at run time; those keep one process-wide thread count that every caller
// overwrites, so then every call is pinned to 1 thread (the device threads give the parallelism).
#include <cblas.h>

#include <cstdio>
#include <mutex>

#include "kernels/cpu/kernels.hpp"

namespace d2l::kernels::cpu {

int blas_parallel_mode() { return openblas_get_parallel(); }  // 0 serial, 1 pthreads, 2 OpenMP

void check_blas() {
  static std::once_flag once;
  std::call_once(once, [] {
    int mode = openblas_get_parallel();
    if (mode != 0) {
      openblas_set_num_threads(1);
      std::fprintf(stderr, "note: a %s OpenBLAS is loaded instead of the serial build; using it with 1 thread per call\n",
                   mode == 2 ? "OpenMP" : "threaded");
    }
  });
}

}  // namespace d2l::kernels::cpu
