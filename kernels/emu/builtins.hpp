// The CUDA built-ins kernel code uses, for g++: index variables, barriers, warp shuffles, atomics,
// fast-math intrinsics and the float4 vector type. They live in d2l::cuda_emu::builtins;
// cuda_emu.hpp makes them visible unqualified inside the emulated kernels' namespace
// (d2l::kernels::emu), as they are under nvcc.
//
// Semantics kept from CUDA (sm_70 and later):
// - threadIdx/blockIdx/blockDim/gridDim are variables (thread_local; the scheduler sets threadIdx
//   before it resumes each emulated thread), so `int tx = threadIdx.x;` and `&blockDim` work.
// - __syncthreads() waits for every thread of the block that has not exited;
// - a warp is 32 consecutive threads of the block (linear id x + y*bx + z*bx*by); shuffles and
//   __syncwarp wait for the lanes named in their mask that have not exited (a lane outside every
//   waiting lane's mask may run on). Reading a lane that did not take part is undefined on a GPU;
//   here it gives that lane's last published value.
// - atomics are std::atomic_ref operations (sequentially consistent; CUDA's are relaxed).
#pragma once
#include <math.h>  // expf, fmaxf, sqrtf, ... in the global namespace, as CUDA's math API has them

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace d2l::cuda_emu {

// Implemented by the block scheduler (block.cpp); valid only inside an emulated kernel.
void sync_block();
void sync_warp(unsigned mask);
// Every lane of `mask` publishes `bits`; each gets back the bits of lane src_lane (0..31) of its
// warp; all-ones bits (NaN) when that lane does not exist or has exited (undefined on a GPU).
uint64_t warp_exchange(uint64_t bits, int src_lane, unsigned mask);
// The warp-wide instructions and cp.async of kernels/emu/ptx.hpp (BlockRunner's, block.hpp).
void warp_gather(const void* mine, size_t bytes, void* all);
void async_copy(void* dst, const void* src, size_t bytes, size_t src_bytes);
void async_commit();
void async_wait(int pending);

[[noreturn]] void misaligned_load(const void* p, size_t bytes);  // throws (launch.cpp)

namespace builtins {

struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return {x, y, z}; }
};

// CUDA's float4: 16 bytes, 16-byte aligned, so that one instruction moves it. Kernels read float
// arrays through float4 pointers (reinterpret_cast), which CUDA allows and ISO C++'s aliasing rules
// do not: may_alias tells g++ so.
struct alignas(16) [[gnu::may_alias]] float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
inline constexpr int warpSize = 32;

inline void __syncthreads() { sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) { sync_warp(mask); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_thread_fence(std::memory_order_seq_cst); }

// ---- warp shuffles: write own value, warp barrier, read the source lane, warp barrier.
namespace detail {
inline int lane_id() {
  return static_cast<int>((threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) % 32u);
}
template <class T>
T shuffle_from(T v, int src_lane, unsigned mask) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_exchange(bits, src_lane, mask);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}
}  // namespace detail

// Value of lane (srcLane mod width) of the caller's width-lane segment.
template <class T>
T __shfl_sync(unsigned mask, T var, int srcLane, int width = 32) {
  int lane = detail::lane_id();
  return detail::shuffle_from(var, lane - lane % width + ((srcLane % width) + width) % width, mask);
}
// Value of lane + delta; lanes whose source falls past their segment keep their own value.
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  int lane = detail::lane_id();
  bool inside = lane % width + static_cast<int>(delta) < width;
  return detail::shuffle_from(var, inside ? lane + static_cast<int>(delta) : lane, mask);
}
// Value of lane - delta; lanes whose source falls before their segment keep their own value.
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  int lane = detail::lane_id();
  bool inside = lane % width >= static_cast<int>(delta);
  return detail::shuffle_from(var, inside ? lane - static_cast<int>(delta) : lane, mask);
}
// Value of lane ^ laneMask; a source in a later segment gives the caller's own value.
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int laneMask, int width = 32) {
  int lane = detail::lane_id();
  int src = lane ^ laneMask;
  if (src >= (lane / width + 1) * width) src = lane;
  return detail::shuffle_from(var, src, mask);
}

// ---- atomics (return the old value, as CUDA's do; the value converts to *address's type)
template <class T>
T atomicAdd(T* address, std::type_identity_t<T> val) {
  static_assert(std::is_arithmetic_v<T>, "atomicAdd: int, unsigned, unsigned long long, float or double");
  return std::atomic_ref<T>(*address).fetch_add(val);
}
template <class T>
T atomicSub(T* address, std::type_identity_t<T> val) {
  return std::atomic_ref<T>(*address).fetch_sub(val);
}
template <class T>
T atomicExch(T* address, std::type_identity_t<T> val) {
  return std::atomic_ref<T>(*address).exchange(val);
}
template <class T>
T atomicCAS(T* address, std::type_identity_t<T> compare, std::type_identity_t<T> val) {
  std::atomic_ref<T>(*address).compare_exchange_strong(compare, val);
  return compare;  // the old value, whether or not it was swapped
}
template <class T>
T atomicMax(T* address, std::type_identity_t<T> val) {
  static_assert(std::is_integral_v<T>, "atomicMax: integers only, as in CUDA");
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old < val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}
template <class T>
T atomicMin(T* address, std::type_identity_t<T> val) {
  static_assert(std::is_integral_v<T>, "atomicMin: integers only, as in CUDA");
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (old > val && !a.compare_exchange_weak(old, val)) {
  }
  return old;
}

// ---- math intrinsics: the fast GPU versions are approximations; here they are the std ones.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __powf(float x, float y) { return std::pow(x, y); }
inline float __fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float x, float y, float z) { return std::fma(x, y, z); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x > 0.0f ? (x < 1.0f ? x : 1.0f) : 0.0f; }  // NaN -> 0
inline int __float2int_rn(float x) { return static_cast<int>(std::nearbyint(x)); }
// A load through the read-only cache. As on a GPU, the address must be aligned to the type: a
// float4 (16 bytes) read from an address that is not a multiple of 16 is an error ("misaligned
// address"), reported here instead of passing silently on the CPU.
template <class T>
T __ldg(const T* p) {
  if (reinterpret_cast<uintptr_t>(p) % alignof(T) != 0) misaligned_load(p, sizeof(T));
  return *p;
}

}  // namespace builtins
}  // namespace d2l::cuda_emu
