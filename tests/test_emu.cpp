// The CUDA emulation (kernels/emu) on small kernels written here: index variables, barriers with
// early-returning threads, deadlock reports, shared memory (one address per block, NaN-filled),
// warp shuffles and atomics (exact), float4 loads (alignment checked), PTX's cp.async, ldmatrix and
// mma.sync (kernels/emu/ptx.hpp: groups, zero fill, per-lane fragments), launch checks and the launch
// log. Cases tagged "threads" spread blocks over several OS threads (run again under TSan).
#include <doctest/doctest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/cuda_emu.hpp"
#include "kernels/emu/fiber.hpp"

namespace cpu = d2l::kernels::cpu;
namespace emu = d2l::cuda_emu;

// ---- kernels under test (device code lives in D2L_CUDA_NS, where the built-ins are visible)
namespace D2L_CUDA_NS::testing {

// Every thread writes its indices: out[g] = {threadIdx, blockIdx, blockDim, gridDim} (12 ints).
__global__ void index_kernel(unsigned* out) {
  const unsigned tid = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const unsigned bid = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
  unsigned* o = out + 12 * (bid * blockDim.x * blockDim.y * blockDim.z + tid);
  const unsigned v[12] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z,
                          blockDim.x,  blockDim.y,  blockDim.z,  gridDim.x,  gridDim.y,  gridDim.z};
  for (int i = 0; i < 12; ++i) o[i] = v[i];
}

// Threads >= live return at once; the rest tree-reduce 0 + 1 + ... + (live - 1) with barriers.
__global__ void early_exit_sum(float* out, int live) {
  D2L_SHARED(float, buf, [1024]);
  const int t = threadIdx.x;
  if (t >= live) return;
  buf[t] = static_cast<float>(t);
  __syncthreads();
  for (int s = 512; s > 0; s >>= 1) {
    if (t < s && t + s < live) buf[t] += buf[t + s];
    __syncthreads();
  }
  if (t == 0) out[blockIdx.x] = buf[0];
}

// Threads 0..15 wait at __syncthreads, 16..31 (same warp) at __syncwarp: nobody can go on.
__global__ void split_barrier_kernel(int* out) {
  if (threadIdx.x < 16)
    __syncthreads();
  else if (threadIdx.x < 32)
    __syncwarp();
  out[blockIdx.x * blockDim.x + threadIdx.x] = 1;
}

// Per warp of a (128-thread) block: sum by __shfl_down_sync (lane 0), by __shfl_xor_sync (every
// lane), lane 5's value by __shfl_sync, inclusive prefix sum by __shfl_up_sync, and sums over
// 8-lane segments (width 8).
__global__ void warp_ops(const float* in, float* down, float* butterfly, float* bcast, float* scan, float* seg8) {
  const unsigned g = blockIdx.x * blockDim.x + threadIdx.x;
  const float v = in[g];
  float s = v;
  for (int off = 16; off > 0; off /= 2) s += __shfl_down_sync(0xffffffffu, s, off);
  if (threadIdx.x % 32 == 0) down[g / 32] = s;
  float b = v;
  for (int m = 1; m < 32; m *= 2) b += __shfl_xor_sync(0xffffffffu, b, m);
  butterfly[g] = b;
  bcast[g] = __shfl_sync(0xffffffffu, v, 5);
  float p = v;
  for (int off = 1; off < 32; off *= 2) {
    const float up = __shfl_up_sync(0xffffffffu, p, off);
    if (static_cast<int>(threadIdx.x % 32) >= off) p += up;
  }
  scan[g] = p;
  float q = v;
  for (int m = 1; m < 8; m *= 2) q += __shfl_xor_sync(0xffffffffu, q, m, 8);
  seg8[g] = q;
}

// Lanes 0..7 shuffle among themselves (mask 0xff) while lanes 8..31 wait at __syncthreads.
__global__ void partial_mask_shuffle(int* out) {
  int v = static_cast<int>(threadIdx.x);
  if (threadIdx.x < 8)
    for (int off = 4; off > 0; off /= 2) v += __shfl_down_sync(0xffu, v, off, 8);
  __syncthreads();
  out[threadIdx.x] = v;
}

// Threads g < n: +1 into an int and a float, max of g.
__global__ void atomic_count(int* count, float* fcount, int* gmax, int n) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g >= n) return;
  atomicAdd(count, 1);
  atomicAdd(fcount, 1.0f);
  atomicMax(gmax, g);
}

// Shared memory: the address each thread sees, what a never-written slot holds, and dynamic
// memory reversed through a barrier.
__global__ void shared_probe(uintptr_t* addr, float* unwritten, int* unwritten_int, float* reversed) {
  D2L_SHARED(float, s, [64]);
  D2L_SHARED(int, si, [64]);
  D2L_DYNAMIC_SHARED(float, dyn);
  const int t = threadIdx.x, g = blockIdx.x * blockDim.x + t;
  addr[g] = reinterpret_cast<uintptr_t>(&s[0]);
  unwritten[g] = s[t];  // NaN: every block starts afresh, though the one before wrote s and si
  unwritten_int[g] = si[t];
  __syncthreads();
  s[t] = 1.0f;
  si[t] = 1;
  dyn[t] = static_cast<float>(g);
  __syncthreads();
  reversed[g] = dyn[blockDim.x - 1 - t];
}

// An over-aligned shared struct after a 4-byte-aligned array, as the TF32 kernels declare theirs (wmma's
// pointers want 32 bytes; CUDA honours __align__ up to 128): the address each thread sees.
struct alignas(128) Aligned128 {
  float v[40];
};
__global__ void shared_alignment_probe(uintptr_t* addr) {
  D2L_SHARED(float, small, [3]);
  D2L_SHARED(Aligned128, big, [2]);
  small[threadIdx.x % 3] = 0.0f;
  addr[threadIdx.x] = reinterpret_cast<uintptr_t>(&big[1]);
}

__global__ void too_much_shared(float* out) {
  D2L_SHARED(float, big, [13000]);  // 52000 bytes > 48 KiB
  big[threadIdx.x] = 1.0f;
  out[0] = big[0];
}

template <int F>
__global__ void scale_kernel(float* x) {
  x[threadIdx.x] *= F;
}

// 64 KiB of dynamic shared memory, every byte written and read back.
__global__ void big_dynamic_shared(float* out) {
  D2L_DYNAMIC_SHARED(float, buf);
  for (int i = threadIdx.x; i < 16384; i += blockDim.x) buf[i] = float(i);
  __syncthreads();
  double sum = 0;
  for (int i = 0; i < 16384; ++i) sum += buf[i];
  if (threadIdx.x == 0) out[0] = float(sum);
}

__global__ void nested_launch(float* x) { D2L_LAUNCH((scale_kernel<2>), 1, 1, 0, nullptr)(x); }

// out = the float4 at x + shift, read through the read-only cache (__ldg), as kernels read float arrays.
__global__ void float4_load(const float* x, int shift, float* out) {
  const float4 v = __ldg(reinterpret_cast<const float4*>(x + shift));
  out[0] = v.x, out[1] = v.y, out[2] = v.z, out[3] = v.w;
}
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "float4 is CUDA's: 16 bytes, 16-byte aligned");

// One warp, two cp.async groups: thread t copies src[t] into buf[t] (zeros where t >= valid), then
// src[32 + t] into buf[32 + t]; after cp.async.wait_group `wait` (2, 1 or 0) it reads both back.
__global__ void cp_async_groups(const float* src, int valid, int wait, float* out) {
  D2L_SHARED(float, buf, [64]);
  const int t = threadIdx.x;
  ptx::cp_async4(&buf[t], &src[t], t < valid);
  ptx::cp_async_commit();
  ptx::cp_async16(&buf[32 + t / 4 * 4], &src[32 + t / 4 * 4], true);  // lanes 4 q .. 4 q + 3 copy one chunk each
  ptx::cp_async_commit();
  if (wait == 2) ptx::cp_async_wait<2>();
  if (wait == 1) ptx::cp_async_wait<1>();
  if (wait == 0) ptx::cp_async_wait<0>();
  out[t] = buf[t];
  out[32 + t] = buf[32 + t];
}

// One warp, d = a b + c with m16n8k8 (a 16 x 8 row-major, b 8 x 8 row-major (k, n), c and d 16 x 8):
// each lane loads its registers as PTX lays them out (g = lane / 4, t = lane % 4), or a's through
// ldmatrix from shared memory (ldsm), and stores its part of d.
__global__ void mma_m16n8k8(const float* a, const float* b, const float* c, float* d, bool ldsm) {
  const int lane = threadIdx.x, g = lane / 4, t = lane % 4;
  auto bits = [](float f) { return std::bit_cast<uint32_t>(f); };
  uint32_t ra[4] = {bits(a[g * 8 + t]), bits(a[(g + 8) * 8 + t]), bits(a[g * 8 + t + 4]), bits(a[(g + 8) * 8 + t + 4])};
  if (ldsm) {
    D2L_SHARED(float4, tile, [32]);  // a, 16 rows of 8
    tile[lane] = make_float4(a[4 * lane], a[4 * lane + 1], a[4 * lane + 2], a[4 * lane + 3]);
    __syncwarp();
    // matrix i = lane / 8: rows (i % 2) 8 .. + 7, columns (i / 2) 4 .. + 3; lane gives row lane % 8 of it
    const int row = lane / 8 % 2 * 8 + lane % 8, col = lane / 16 * 4;
    ptx::ldmatrix_x4(ra, reinterpret_cast<const float*>(tile) + row * 8 + col);
  }
  const uint32_t rb[2] = {bits(b[t * 8 + g]), bits(b[(t + 4) * 8 + g])};
  float rd[4] = {c[g * 8 + 2 * t], c[g * 8 + 2 * t + 1], c[(g + 8) * 8 + 2 * t], c[(g + 8) * 8 + 2 * t + 1]};
  ptx::mma_tf32_m16n8k8(rd, ra, rb);
  d[g * 8 + 2 * t] = rd[0], d[g * 8 + 2 * t + 1] = rd[1], d[(g + 8) * 8 + 2 * t] = rd[2], d[(g + 8) * 8 + 2 * t + 1] = rd[3];
}

__global__ void mma_partial_warp(float* d) {
  const uint32_t a[4] = {}, b[2] = {};
  float r[4] = {};
  ptx::mma_tf32_m16n8k8(r, a, b);
  d[threadIdx.x] = r[0];
}

}  // namespace D2L_CUDA_NS::testing

namespace k = d2l::kernels::emu::testing;
using emu::dim3;

namespace {
// Device budget for the multi-threaded cases: the calling thread + 3 helpers.
struct Threads4 {
  cpu::ThreadPool pool{3};
  cpu::Ctx ctx{4, &pool};
};
}  // namespace

TEST_CASE("fibers switch back and forth; yield outside a fiber is an error") {
  std::vector<int> trace;
  emu::Fiber f(emu::kFiberStackBytes);
  struct Arg {
    std::vector<int>* trace;
  } arg{&trace};
  f.start(
      [](void* p) {
        auto* a = static_cast<Arg*>(p);
        for (int i = 0; i < 3; ++i) {
          a->trace->push_back(i);
          emu::Fiber::yield();
        }
      },
      &arg);
  while (!f.finished()) {
    trace.push_back(-1);
    f.resume();
  }
  CHECK(trace == std::vector<int>{-1, 0, -1, 1, -1, 2, -1});
  CHECK_THROWS_AS(emu::Fiber::yield(), std::logic_error);
  CHECK_THROWS_AS(d2l::kernels::emu::__syncthreads(), std::logic_error);
}

TEST_CASE("threadIdx, blockIdx, blockDim and gridDim in a 3-D grid of 3-D blocks") {
  const dim3 grid(3, 2, 2), block(5, 3, 2);
  std::vector<unsigned> out(12 * 12 * 30, 999);
  D2L_LAUNCH(k::index_kernel, grid, block, 0, nullptr)(out.data());
  int bad = 0;
  for (unsigned bz = 0; bz < 2; ++bz)
    for (unsigned by = 0; by < 2; ++by)
      for (unsigned bx = 0; bx < 3; ++bx)
        for (unsigned tz = 0; tz < 2; ++tz)
          for (unsigned ty = 0; ty < 3; ++ty)
            for (unsigned tx = 0; tx < 5; ++tx) {
              unsigned g = ((bz * 2 + by) * 3 + bx) * 30 + (tz * 3 + ty) * 5 + tx;
              const unsigned want[12] = {tx, ty, tz, bx, by, bz, 5, 3, 2, 3, 2, 2};
              for (int i = 0; i < 12; ++i) bad += out[12 * g + i] != want[i];
            }
  CHECK(bad == 0);
}

TEST_CASE("early-returning threads count as arrived at __syncthreads (no hang)") {
  for (int live : {1, 100, 1024}) {
    std::vector<float> out(3, -1.0f);
    D2L_LAUNCH(k::early_exit_sum, 3, 1024, 0, nullptr)(out.data(), live);
    const float want = static_cast<float>(live) * static_cast<float>(live - 1) / 2;  // exact in float
    CHECK(out == std::vector<float>(3, want));
  }
}

TEST_CASE("a barrier some threads never reach is reported as a deadlock naming the kernel") {
  std::vector<int> out(64, 0);
  std::string msg;
  try {
    D2L_LAUNCH(k::split_barrier_kernel, 1, 64, 0, nullptr)(out.data());
  } catch (const std::runtime_error& e) {
    msg = e.what();
  }
  CHECK(msg ==
        "deadlock in kernel k::split_barrier_kernel: 16 of 64 threads wait at __syncthreads, 16 at __syncwarp or "
        "a warp shuffle, the rest exited (block (0,0,0))");
  // The waiting threads were unwound: they never wrote; the runner works again afterwards.
  CHECK(out[0] == 0);
  CHECK(out[40] == 1);
  std::vector<float> sum(1);
  D2L_LAUNCH(k::early_exit_sum, 1, 64, 0, nullptr)(sum.data(), 64);
  CHECK(sum[0] == 2016.0f);
}

TEST_CASE("shuffles: warp sums are exact, broadcast, scan and 8-lane segments") {
  const int n = 2 * 128;  // 2 blocks of 4 warps
  std::vector<float> in(n), down(n / 32), butterfly(n), bcast(n), scan(n), seg8(n);
  for (int g = 0; g < n; ++g) in[g] = static_cast<float>(g % 32);  // lane values 0..31
  D2L_LAUNCH(k::warp_ops, 2, 128, 0, nullptr)(in.data(), down.data(), butterfly.data(), bcast.data(), scan.data(),
                                              seg8.data());
  CHECK(down == std::vector<float>(n / 32, 496.0f));  // 0 + 1 + ... + 31
  CHECK(butterfly == std::vector<float>(n, 496.0f));
  CHECK(bcast == std::vector<float>(n, 5.0f));
  int bad = 0;
  for (int g = 0; g < n; ++g) {
    const int lane = g % 32, seg0 = lane / 8 * 8;
    bad += scan[g] != static_cast<float>(lane * (lane + 1) / 2);
    bad += seg8[g] != static_cast<float>(8 * seg0 + 28);  // seg0 + ... + seg0 + 7
  }
  CHECK(bad == 0);
}

TEST_CASE("a shuffle with a partial mask does not wait for lanes outside it") {
  std::vector<int> out(64);
  D2L_LAUNCH(k::partial_mask_shuffle, 1, 64, 0, nullptr)(out.data());
  CHECK(out[0] == 0 + 1 + 2 + 3 + 4 + 5 + 6 + 7);
  CHECK(out[8] == 8);
  CHECK(out[63] == 63);
}

TEST_CASE("atomics from 10000 threads in 40 blocks are exact" * doctest::test_suite("threads")) {
  Threads4 dev;
  const cpu::Ctx* streams[] = {nullptr, &dev.ctx};  // the calling thread alone; 4 threads
  for (const cpu::Ctx* stream : streams) {
    int count = 0, gmax = -1;
    float fcount = 0.0f;
    D2L_LAUNCH(k::atomic_count, 40, 256, 0, stream)(&count, &fcount, &gmax, 10000);
    CHECK(count == 10000);
    CHECK(fcount == 10000.0f);
    CHECK(gmax == 9999);
  }
}

TEST_CASE("shared memory: one address per block, NaN until written, dynamic bytes") {
  const int blocks = 3, t = 64, n = blocks * t;
  std::vector<uintptr_t> addr(n);
  std::vector<float> unwritten(n), reversed(n);
  std::vector<int> unwritten_int(n);
  D2L_LAUNCH(k::shared_probe, blocks, t, t * sizeof(float), nullptr)(addr.data(), unwritten.data(),
                                                                     unwritten_int.data(), reversed.data());
  int bad = 0;
  for (int g = 0; g < n; ++g) {
    bad += addr[g] != addr[g / t * t];
    bad += !std::isnan(unwritten[g]);
    bad += unwritten_int[g] != -1;
    bad += reversed[g] != static_cast<float>(g / t * t + t - 1 - g % t);
  }
  CHECK(bad == 0);
}

TEST_CASE("shared memory: a declaration's alignas is honoured up to 128 bytes") {
  std::vector<uintptr_t> addr(32);
  D2L_LAUNCH(k::shared_alignment_probe, 1, 32, 0, nullptr)(addr.data());
  for (uintptr_t a : addr) CHECK(a % 128 == 0);
}

TEST_CASE("bad launches: too many threads, too much shared memory, a launch inside a kernel") {
  std::vector<float> x(1024, 1.0f);
  auto message = [](auto&& launch) {
    try {
      launch();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = message([&] { D2L_LAUNCH(k::scale_kernel<2>, 1, 1025, 0, nullptr)(x.data()); });
  CHECK(m.find("invalid launch of kernel k::scale_kernel<2>: grid (1,1,1), block (1025,1,1)") == 0);
  CHECK(m.find("more than 1024 threads a block") != std::string::npos);
  m = message([&] { D2L_LAUNCH(k::scale_kernel<2>, 1, 32, 49153, nullptr)(x.data()); });
  CHECK(m.find("more than 48 KiB of dynamic shared memory") != std::string::npos);
  m = message([&] { D2L_LAUNCH(k::too_much_shared, 1, 32, 0, nullptr)(x.data()); });
  CHECK(m.find("kernel k::too_much_shared block (0,0,0) thread (0,0,0): shared memory needs 52000 bytes") == 0);
  m = message([&] { D2L_LAUNCH(k::big_dynamic_shared, 1, 32, 65536, nullptr)(x.data()); });
  CHECK(m.find("more than 48 KiB of dynamic shared memory (without an opt-in") != std::string::npos);
  m = message([&] { D2L_SET_MAX_DYNAMIC_SHARED(k::big_dynamic_shared, 228 * 1024); });
  CHECK(m.find("more than the 232448 (227 KiB) a block may opt in to") != std::string::npos);
  D2L_SET_MAX_DYNAMIC_SHARED(k::big_dynamic_shared, 32768);  // opted in, but to less than the launch asks
  m = message([&] { D2L_LAUNCH(k::big_dynamic_shared, 1, 32, 65536, nullptr)(x.data()); });
  CHECK(m.find("more dynamic shared memory than the kernel opted in to (32768 bytes)") != std::string::npos);
  D2L_SET_MAX_DYNAMIC_SHARED(k::big_dynamic_shared, 65536);  // cudaFuncSetAttribute's opt-in: now it runs
  CHECK(message([&] { D2L_LAUNCH(k::big_dynamic_shared, 1, 32, 65536, nullptr)(x.data()); }) == "no error");
  CHECK(x[0] == float(16383.0 * 16384.0 / 2));
  m = message([&] { D2L_LAUNCH(k::too_much_shared, 1, 32, 0, nullptr)(x.data()); });  // a kernel not opted in: still 48 KiB
  CHECK(m.find("shared memory needs 52000 bytes (static + dynamic), more than the 49152 (48 KiB)") != std::string::npos);
  m = message([&] { D2L_LAUNCH(k::nested_launch, 1, 1, 0, nullptr)(x.data()); });
  CHECK(m.find("launched from inside a kernel") != std::string::npos);
}

TEST_CASE("float4 loads: aligned addresses read 4 floats, a misaligned one is an error as on a GPU") {
  alignas(16) float x[12] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  float out[4] = {};
  D2L_LAUNCH(k::float4_load, 1, 1, 0, nullptr)(x, 4, out);
  CHECK(out[0] == 4.0f);
  CHECK(out[3] == 7.0f);
  std::string m;
  try {
    D2L_LAUNCH(k::float4_load, 1, 1, 0, nullptr)(x, 1, out);
  } catch (const std::runtime_error& e) {
    m = e.what();
  }
  CHECK(m.find("kernel k::float4_load block (0,0,0) thread (0,0,0): misaligned address: a 16-byte load from") == 0);
}

TEST_CASE("cp.async: a group lands at its wait_group, reads NaN before, zero-fills invalid sources") {
  std::vector<float> src(64), out(64);
  for (int i = 0; i < 64; ++i) src[i] = static_cast<float>(i + 1);
  for (int wait : {2, 1, 0}) {
    CAPTURE(wait);
    D2L_LAUNCH(k::cp_async_groups, 1, 32, 0, nullptr)(src.data(), 24, wait, out.data());
    int bad = 0;
    for (int t = 0; t < 32; ++t) {
      const float first = t < 24 ? src[t] : 0.0f;  // zeros where the source was not valid
      bad += wait <= 1 ? out[t] != first : !std::isnan(out[t]);
      bad += wait == 0 ? out[32 + t] != src[32 + t] : !std::isnan(out[32 + t]);
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("mma.sync m16n8k8: PTX's fragment layout per lane, TF32 inputs truncated, ldmatrix's rows") {
  std::vector<float> a(16 * 8), b(8 * 8), c(16 * 8), d(16 * 8), d2(16 * 8);
  uint32_t r = 7;
  auto next = [&r] { return static_cast<float>(static_cast<int>((r = r * 1664525u + 1013904223u) >> 27) - 16); };
  for (float& x : a) x = next();
  for (float& x : b) x = next();
  for (float& x : c) x = next();
  D2L_LAUNCH(k::mma_m16n8k8, 1, 32, 0, nullptr)(a.data(), b.data(), c.data(), d.data(), false);
  D2L_LAUNCH(k::mma_m16n8k8, 1, 32, 0, nullptr)(a.data(), b.data(), c.data(), d2.data(), true);
  int bad = 0;  // small integers: every product and sum exact
  for (int i = 0; i < 16; ++i)
    for (int j = 0; j < 8; ++j) {
      double s = c[i * 8 + j];
      for (int q = 0; q < 8; ++q) s += double(a[i * 8 + q]) * b[q * 8 + j];
      bad += d[i * 8 + j] != s;
      bad += d2[i * 8 + j] != s;  // a's fragment through ldmatrix: the same registers
    }
  CHECK(bad == 0);
  // The tensor core reads 19 bits of an FP32: 1 + 2^-12 is 1 to it, 1 + 2^-10 is not.
  std::fill(a.begin(), a.end(), 1.0f + std::ldexp(1.0f, -12));
  std::fill(b.begin(), b.end(), 1.0f);
  std::fill(c.begin(), c.end(), 0.0f);
  D2L_LAUNCH(k::mma_m16n8k8, 1, 32, 0, nullptr)(a.data(), b.data(), c.data(), d.data(), false);
  CHECK(d[0] == 8.0f);
  std::fill(a.begin(), a.end(), 1.0f + std::ldexp(1.0f, -10));
  D2L_LAUNCH(k::mma_m16n8k8, 1, 32, 0, nullptr)(a.data(), b.data(), c.data(), d.data(), false);
  CHECK(d[0] == 8.0f * (1.0f + std::ldexp(1.0f, -10)));
  // A warp-wide instruction in a warp of fewer than 32 threads: an error, not a wrong answer.
  std::string m;
  try {
    D2L_LAUNCH(k::mma_partial_warp, 1, 16, 0, nullptr)(d.data());
  } catch (const std::runtime_error& e) {
    m = e.what();
  }
  CHECK(m.find("needs a full warp of 32 threads") != std::string::npos);
}

TEST_CASE("the launch log counts every launch by kernel name" * doctest::test_suite("threads")) {
  Threads4 dev;
  emu::clear_launch_log();
  std::vector<float> x(32, 1.0f);
  D2L_LAUNCH((k::scale_kernel<3>), 1, 32, 0, &dev.ctx)(x.data());
  D2L_LAUNCH((k::scale_kernel<3>), 1, 32, 0, nullptr)(x.data());
  std::vector<float> sum(4);
  D2L_LAUNCH(k::early_exit_sum, 4, 128, 0, &dev.ctx)(sum.data(), 128);
  CHECK(x[31] == 9.0f);
  CHECK(sum == std::vector<float>(4, 8128.0f));
  const auto log = emu::launch_log();
  CHECK(log == std::map<std::string, int64_t>{{"k::scale_kernel<3>", 2}, {"k::early_exit_sum", 1}});
}

TEST_CASE("a deadlock in one block of a multi-threaded grid is reported, not hung" * doctest::test_suite("threads")) {
  Threads4 dev;
  std::vector<int> out(64 * 16, 0);
  CHECK_THROWS_WITH_AS(D2L_LAUNCH(k::split_barrier_kernel, 16, 64, 0, &dev.ctx)(out.data()),
                       doctest::Contains("deadlock in kernel k::split_barrier_kernel: 16 of 64 threads"),
                       std::runtime_error);
  int count = 0;
  float fcount = 0;
  int gmax = 0;
  D2L_LAUNCH(k::atomic_count, 64, 64, 0, &dev.ctx)(&count, &fcount, &gmax, 4096);  // the pool still works
  CHECK(count == 4096);
}
