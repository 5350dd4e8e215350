// The CUDA runtime layer in a build without nvcc: there are no gpu(i) devices (num_gpus() is 0 and
// runtime() refuses them first), so nothing here is reached in a correct program.
#include "core/gpu/cuda_layer.hpp"

#include "core/device.hpp"  // DeviceError

namespace d2l::cuda_layer {

[[noreturn]] static void not_built() { throw DeviceError("this build has no CUDA backend (nvcc was not found)"); }

void set_device(int) { not_built(); }
void* malloc(int, size_t) { not_built(); }
void free(int, void*) {}
void fill_bytes(int, void*, unsigned char, size_t) { not_built(); }
void* stream_create(int) { not_built(); }
void stream_synchronize(int, void*) { not_built(); }
void* blas_create(int, void*) { not_built(); }
void copy(void*, int, const void*, int, size_t, void*, bool) { not_built(); }
void sgemm(void*, bool, bool, int64_t, int64_t, int64_t, float, const float*, const float*, float, float*) { not_built(); }
void gemm16(void*, bool, bool, bool, int64_t, int64_t, int64_t, float, const uint16_t*, const uint16_t*, float, float*) {
  not_built();
}

}  // namespace d2l::cuda_layer
