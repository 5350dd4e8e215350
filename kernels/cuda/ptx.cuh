// PTX's warp-level matrix instructions and asynchronous copies for nvcc, as inline assembly: the
// instructions the warp matrix API (wmma) does not reach. kernels/emu/ptx.hpp emulates the same
// functions and says what each does and how its fragments lie in the lanes.
//
//   cp_async4/16(dst, src, valid)    cp.async (sm_80): global -> shared memory, zeros when !valid
//   cp_async_commit()                cp.async.commit_group
//   cp_async_wait<N>()               cp.async.wait_group N
//   ldmatrix_x4(r, row)              ldmatrix.sync.aligned.m8n8.x4.shared.b16 (sm_75)
//   mma_tf32_m16n8k8(d, a, b)        mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += a b (sm_80)
//   mma_bf16_m16n8k16(d, a, b)       mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, d += a b (sm_80)
//   mma_f16_m16n8k16(d, a, b)        mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32, d += a b (sm_80)
//
// Below sm_80 they compile to a trap: the kernels that use them are built empty there and their
// launchers refuse such devices, as for every TF32 kernel.
#pragma once
#include <cstdint>

namespace d2l::kernels::cuda::ptx {

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define D2L_PTX_SM80 1
#endif

__device__ __forceinline__ unsigned shared_address(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// cp.async of Bytes (4, 8 or 16): .ca (through L1) for the small copies, .cg (L2 only) for 16 bytes.
template <int Bytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, bool valid) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp.async copies 4, 8 or 16 bytes");
#ifdef D2L_PTX_SM80
  if constexpr (Bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(shared_address(dst)), "l"(src), "r"(valid ? 16 : 0));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n" ::"r"(shared_address(dst)), "l"(src), "n"(Bytes),
                 "r"(valid ? Bytes : 0));
#else
  __trap();
#endif
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) { cp_async<4>(dst, src, valid); }
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) { cp_async<16>(dst, src, valid); }
__device__ __forceinline__ void cp_async_commit() {
#ifdef D2L_PTX_SM80
  asm volatile("cp.async.commit_group;\n" ::);
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef D2L_PTX_SM80
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
#endif
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 750
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(shared_address(row)));
#else
  __trap();
#endif
}

__device__ __forceinline__ void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef D2L_PTX_SM80
  asm volatile(
      "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#else
  __trap();
#endif
}

// The 16-bit products, one macro for both formats' instruction strings.
#define D2L_PTX_MMA16(type)                                                                                        \
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." type "." type ".f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, " \
               "{%8, %9}, {%0, %1, %2, %3};\n"                                                                   \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                                                  \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
__device__ __forceinline__ void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef D2L_PTX_SM80
  D2L_PTX_MMA16("bf16");
#else
  __trap();
#endif
}
__device__ __forceinline__ void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef D2L_PTX_SM80
  D2L_PTX_MMA16("f16");
#else
  __trap();
#endif
}
#undef D2L_PTX_MMA16

#undef D2L_PTX_SM80

}  // namespace d2l::kernels::cuda::ptx
