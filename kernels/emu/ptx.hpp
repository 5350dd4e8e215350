// PTX's warp-level matrix instructions and asynchronous copies under the emulation: what
// kernels/cuda/ptx.cuh writes as inline assembly for nvcc, with the same names and arguments, so a
// kernel calls `ptx::...` in both builds.
//
//   cp_async4/16(dst, src, valid)    cp.async.{ca,cg}.shared.global: 4 or 16 bytes from global to shared
//                                    memory without passing through registers; !valid copies zeros
//                                    (src-size 0: src is not read).
//   cp_async_commit()                cp.async.commit_group: the copies issued since the last commit
//                                    become one group.
//   cp_async_wait<N>()               cp.async.wait_group N: every group but the newest N has landed.
//   ldmatrix_x4(r, row)              ldmatrix.sync.aligned.m8n8.x4.shared.b16: four 8 x 8 matrices of
//                                    16-bit elements (8 rows of 16 bytes each); lane l gives the address
//                                    of row l % 8 of matrix l / 8, and receives in r[i] the 32-bit word
//                                    (l % 4) of row l / 4 of matrix i. With 32-bit elements (TF32) a row
//                                    is 4 of them and lane l gets element (l / 4, l % 4).
//   mma_tf32_m16n8k8(d, a, b)        mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, d += a b:
//                                    a 16 x 8, b 8 x 8, d 16 x 8, spread over the warp's lanes as PTX
//                                    lays them out, with g = lane / 4 and t = lane % 4:
//                                      a[0] (g, t)     a[1] (g + 8, t)   a[2] (g, t + 4)   a[3] (g + 8, t + 4)
//                                      b[0] (t, g)     b[1] (t + 4, g)                     (row k, column n)
//                                      d[0] (g, 2t)    d[1] (g, 2t + 1)  d[2] (g + 8, 2t)  d[3] (g + 8, 2t + 1)
//   mma_bf16_m16n8k16(d, a, b)       mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 (and mma_f16_m16n8k16,
//                                    .f16): a 16 x 16, b 16 x 8, d 16 x 8 as above; each 32-bit register holds
//                                    two 16-bit elements of consecutive k, the lower k in the low half:
//                                      a[0] (g, 2t..2t+1)   a[1] (g + 8, 2t..)   a[2] (g, 2t + 8..)   a[3] (g + 8, 2t + 8..)
//                                      b[0] (2t..2t+1, g)   b[1] (2t + 8.., g)                        (row k, column n)
//
// How each is emulated:
// - cp.async: the copy is recorded with the source's bytes read at the issue, and its destination is
//   filled with 0xFF bytes (NaN) at once; the bytes land when a wait leaves its group behind. A kernel
//   that reads a tile before waiting for it (or waits for too few groups) reads NaN, on every run.
// - ldmatrix and mma.sync are warp-wide: every lane publishes its operands (one warp barrier,
//   BlockRunner::warp_gather) and computes its own part of the result from all 32 lanes' registers,
//   through the fragment layout above. So a kernel that puts an element in the wrong register gets a
//   wrong product here as on the GPU.
// - The tensor core reads a TF32 operand's 19 high bits (an FP32 that was not rounded with
//   cvt.rna.tf32.f32 is truncated), multiplies exactly and adds the products in FP32; here onto d in
//   k order, as kernels/emu/wmma.hpp does (the hardware's order within one instruction is unspecified).
//   A product of two bfloat16 or two float16 values is exact in FP32 (8 + 8 or 11 + 11 significant
//   bits); they are added onto d the same way.
#pragma once
#include <cstdint>
#include <cstring>

#include "kernels/cpu/float16.hpp"
#include "kernels/emu/builtins.hpp"
#include "kernels/emu/wmma.hpp"

namespace d2l::cuda_emu::ptx {

inline void cp_async4(void* dst, const void* src, bool valid) { async_copy(dst, src, 4, valid ? 4 : 0); }
inline void cp_async16(void* dst, const void* src, bool valid) { async_copy(dst, src, 16, valid ? 16 : 0); }
inline void cp_async_commit() { async_commit(); }
template <int N>
inline void cp_async_wait() {
  static_assert(N >= 0, "cp.async.wait_group takes a count of groups, >= 0");
  async_wait(N);
}

inline void ldmatrix_x4(uint32_t (&r)[4], const void* row) {
  const void* rows[32];
  warp_gather(&row, sizeof row, rows);  // every lane's row address
  const int lane = builtins::detail::lane_id();
  for (int i = 0; i < 4; ++i)  // matrix i, row lane / 4, 32-bit word lane % 4
    std::memcpy(&r[i], static_cast<const unsigned char*>(rows[8 * i + lane / 4]) + 4 * (lane % 4), 4);
}

// The operand registers of every lane of the warp (one warp barrier): an mma.sync's inputs.
struct MmaRegs {
  uint32_t a[4], b[2];
};
inline void gather_operands(const uint32_t (&a)[4], const uint32_t (&b)[2], MmaRegs (&all)[32]) {
  MmaRegs mine{};
  std::memcpy(mine.a, a, sizeof mine.a);
  std::memcpy(mine.b, b, sizeof mine.b);
  warp_gather(&mine, sizeof mine, all);
}

inline void mma_tf32_m16n8k8(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaRegs all[32];
  gather_operands(a, b, all);
  auto A = [&](int row, int k) {  // the lane and register that hold a's element (row, k)
    const MmaRegs& l = all[4 * (row % 8) + k % 4];
    return l.a[(row / 8) + 2 * (k / 4)];
  };
  auto B = [&](int k, int n) { return all[4 * n + k % 4].b[k / 4]; };
  auto tf32 = [](uint32_t bits) { return wmma::detail::tf32_truncate(wmma::detail::float_of(bits)); };
  const int lane = builtins::detail::lane_id(), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = d[i];
    for (int k = 0; k < 8; ++k) s += tf32(A(row, k)) * tf32(B(k, col));
    d[i] = s;
  }
}

// The 16-bit mma.sync m16n8k16 of either format (layout above).
template <kernels::cpu::Float16 F>
inline void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaRegs all[32];
  gather_operands(a, b, all);
  // Element k of a register pair: the low half holds the even k.
  auto half = [](uint32_t word, int k) { return kernels::cpu::widen(F, static_cast<uint16_t>(k % 2 ? word >> 16 : word)); };
  auto A = [&](int row, int k) { return half(all[4 * (row % 8) + k % 8 / 2].a[row / 8 + 2 * (k / 8)], k); };
  auto B = [&](int k, int n) { return half(all[4 * n + k % 8 / 2].b[k / 8], k); };
  const int lane = builtins::detail::lane_id(), g = lane / 4, t = lane % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += A(row, k) * B(k, col);
    d[i] = s;
  }
}
inline void mma_bf16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_m16n8k16<kernels::cpu::Float16::bf16>(d, a, b);
}
inline void mma_f16_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  mma_m16n8k16<kernels::cpu::Float16::f16>(d, a, b);
}

}  // namespace d2l::cuda_emu::ptx
