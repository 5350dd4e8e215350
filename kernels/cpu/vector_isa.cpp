// The vector instruction sets the CPU's hand-vectorised kernels are built for (GEMM kernel3, conv2d
// kernel4): each is compiled once per set in a `#pragma GCC target` region, and runs the widest set
// this CPU has unless a test or benchmark forces another.
#include <vector>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

VectorIsa best_vector_isa() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl")) return VectorIsa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return VectorIsa::avx2;
#endif
  return VectorIsa::portable;
}

std::vector<VectorIsa> vector_isas() {
  std::vector<VectorIsa> isas{VectorIsa::portable};
  const VectorIsa best = best_vector_isa();
  if (best == VectorIsa::avx2 || best == VectorIsa::avx512) isas.push_back(VectorIsa::avx2);
  if (best == VectorIsa::avx512) isas.push_back(VectorIsa::avx512);
  return isas;
}

const char* vector_isa_name(VectorIsa isa) {
  switch (isa) {
    case VectorIsa::avx512: return "avx512 (16 floats)";
    case VectorIsa::avx2: return "avx2+fma (8 floats)";
    default: return "portable (4-float SSE vectors)";
  }
}

int vector_isa_floats(VectorIsa isa) { return isa == VectorIsa::avx512 ? 16 : isa == VectorIsa::avx2 ? 8 : 4; }

}  // namespace d2l::kernels::cpu
