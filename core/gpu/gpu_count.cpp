// How many physical GPUs this process can use. Built against the CUDA runtime when the project is built
// with nvcc (D2L_WITH_CUDA); a machine without a GPU or without a driver answers an error there
// (35: insufficient driver, 100: no device), which means zero GPUs — never a crash.
#include "core/device.hpp"

#ifdef D2L_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace d2l {

int num_physical_gpus() {
#ifdef D2L_WITH_CUDA
  static const int count = [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();  // clear the sticky error
      return 0;
    }
    return n;
  }();
  return count;
#else
  return 0;  // built without CUDA
#endif
}

bool built_with_cuda() {
#ifdef D2L_WITH_CUDA
  return true;
#else
  return false;
#endif
}

}  // namespace d2l
