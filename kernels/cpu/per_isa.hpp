// One set of loops compiled three times, for AVX-512, for AVX2 and for any x86-64, in namespaces
// avx512, avx2 and portable, and D2L_ON_BEST_ISA(call) to run the best set this CPU has (checked
// once, vector_isa.cpp). Define D2L_PER_ISA_LOOPS as the header that holds the loops (templates with
// no includes of their own: float16.hpp and kernels.hpp come first), then include this file inside
// namespace d2l::kernels::cpu, once per translation unit. The sets differ only in the instructions
// the compiler may use; floating-point contraction stays as the file's flags say.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx2,fma")
namespace avx512 {
#include D2L_PER_ISA_LOOPS
}  // namespace avx512
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma")
namespace avx2 {
#include D2L_PER_ISA_LOOPS
}  // namespace avx2
#pragma GCC pop_options

namespace portable {
#include D2L_PER_ISA_LOOPS
}  // namespace portable

#undef D2L_PER_ISA_LOOPS

// Calls ISA::NAME<...>(args) for the best instruction set this CPU has.
#ifndef D2L_ON_BEST_ISA
#define D2L_ON_BEST_ISA(call)                                  \
  do {                                                         \
    switch (best_vector_isa()) {                               \
      case VectorIsa::avx512: avx512::call; break;             \
      case VectorIsa::avx2: avx2::call; break;                 \
      default: portable::call; break;                          \
    }                                                          \
  } while (0)
#endif
