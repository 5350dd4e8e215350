// Plain blocks (kernels/emu/block.hpp): a block starts as a plain loop over its threads and falls
// back to a fiber per thread at the first barrier or shuffle any thread reaches. Kernels that never
// synchronise run plain; a kernel that reaches a barrier only in some threads or some blocks (so
// that a first look at thread 0 would wrongly call it barrier-free) is caught at that barrier, and
// every result is the same as with fibers from the start (set_plain_blocks(false)).
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/cuda_emu.hpp"

namespace cpu = d2l::kernels::cpu;
namespace emu = d2l::cuda_emu;

namespace D2L_CUDA_NS::plain_testing {

// No barrier: out[g] = 2 * g.
__global__ void twice(float* out, int n) {
  const int g = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (g < n) out[g] = 2.0f * static_cast<float>(g);
}

// Only block `sync_block` synchronises, and there only threads >= first: they publish t in shared
// memory, wait, and read their right neighbour's slot (wrapping to `first`). The rest write -t and
// exit before any barrier. Thread 0 of every block never waits.
__global__ void late_barrier(float* out, int first, unsigned sync_block) {
  D2L_SHARED(float, s, [256]);
  const int t = threadIdx.x, g = static_cast<int>(blockIdx.x * blockDim.x) + t;
  if (blockIdx.x != sync_block || t < first) {
    out[g] = -static_cast<float>(t);
    return;
  }
  s[t] = static_cast<float>(t);
  __syncthreads();
  const int right = t + 1 < static_cast<int>(blockDim.x) ? t + 1 : first;
  out[g] = s[right];
}

// Threads >= first sum their warp by shuffles (warp 1 of a 64-thread block, all 32 lanes when
// first <= 32); the others exit first.
__global__ void late_shuffle(float* out, int first) {
  const int t = threadIdx.x;
  if (t < first) return;
  float v = static_cast<float>(t);
  for (int off = 16; off > 0; off /= 2) v += __shfl_down_sync(0xffffffffu, v, off);
  out[t] = v;
}

// Missing barrier: each thread writes its slot and reads its right neighbour's without waiting.
__global__ void missing_barrier(float* out) {
  D2L_SHARED(float, s, [64]);
  const int t = threadIdx.x;
  s[t] = 1.0f;
  out[t] = s[(t + 1) % 64];
}

// Thread 40 waits at __syncthreads, thread 50 (same warp) at __syncwarp: a deadlock whose first
// barrier is reached by a thread other than 0.
__global__ void late_deadlock(int* out) {
  const int t = threadIdx.x;
  if (t == 40) __syncthreads();
  if (t == 50) __syncwarp();
  out[t] = 1;
}

}  // namespace D2L_CUDA_NS::plain_testing

namespace k = d2l::kernels::emu::plain_testing;

namespace {
// Runs launch() with plain blocks on and off; returns the block counts of the plain run.
template <class F>
emu::BlockCounts both_ways(F&& launch) {
  emu::set_plain_blocks(false);
  launch(false);
  emu::set_plain_blocks(true);
  emu::clear_block_counts();
  launch(true);
  return emu::block_counts();
}
}  // namespace

TEST_CASE("a kernel that never synchronises runs as a plain loop, with the fibers' results") {
  std::vector<float> with_fibers(1000, -1.0f), plain(1000, -1.0f);
  const emu::BlockCounts c = both_ways([&](bool p) {
    D2L_LAUNCH(k::twice, 4, 256, 0, nullptr)((p ? plain : with_fibers).data(), 1000);
  });
  CHECK(c.plain == 4);
  CHECK(c.fibers == 0);
  CHECK(plain == with_fibers);
  CHECK(plain[999] == 1998.0f);
}

TEST_CASE("a barrier reached only by later threads of one block falls back to fibers there") {
  for (int first : {0, 1, 37, 255}) {
    std::vector<float> with_fibers(3 * 256, 0.0f), plain(3 * 256, 0.0f);
    const emu::BlockCounts c = both_ways([&](bool p) {
      D2L_LAUNCH(k::late_barrier, 3, 256, 0, nullptr)((p ? plain : with_fibers).data(), first, 1);
    });
    CHECK(c.plain == 2);   // blocks 0 and 2 never wait
    CHECK(c.fibers == 1);  // block 1 falls back at thread `first`
    CHECK(plain == with_fibers);
    int bad = 0;
    for (int t = 0; t < 256; ++t) {
      bad += plain[t] != -static_cast<float>(t) || plain[512 + t] != -static_cast<float>(t);
      const float want = t < first ? -static_cast<float>(t) : static_cast<float>(t + 1 < 256 ? t + 1 : first);
      bad += plain[256 + t] != want;
    }
    CHECK(bad == 0);
  }
}

TEST_CASE("a shuffle reached first by a later thread falls back, with the fibers' results") {
  for (int first : {0, 32, 40}) {
    std::vector<float> with_fibers(64, 0.0f), plain(64, 0.0f);
    const emu::BlockCounts c = both_ways([&](bool p) {
      D2L_LAUNCH(k::late_shuffle, 1, 64, 0, nullptr)((p ? plain : with_fibers).data(), first);
    });
    CHECK(c.fibers == 1);
    CHECK(std::memcmp(plain.data(), with_fibers.data(), 64 * sizeof(float)) == 0);  // NaNs included
    if (first == 32) CHECK(plain[32] == static_cast<float>(32 * 31 / 2 + 32 * 32));  // 32 + ... + 63
  }
}

TEST_CASE("a missing barrier still reads NaN from shared memory in a plain block") {
  std::vector<float> out(64, 0.0f);
  D2L_LAUNCH(k::missing_barrier, 1, 64, 0, nullptr)(out.data());
  int nan = 0;
  for (float v : out) nan += std::isnan(v);
  CHECK(nan == 63);  // thread t runs before t + 1 writes; thread 63 reads thread 0's slot
  CHECK(out[63] == 1.0f);
}

TEST_CASE("a deadlock whose first barrier is reached by thread 40 is reported and unwound") {
  std::vector<int> out(64, 0);
  CHECK_THROWS_WITH_AS(D2L_LAUNCH(k::late_deadlock, 1, 64, 0, nullptr)(out.data()),
                       "deadlock in kernel k::late_deadlock: 1 of 64 threads wait at __syncthreads, 1 at "
                       "__syncwarp or a warp shuffle, the rest exited (block (0,0,0))",
                       std::runtime_error);
  CHECK(out[39] == 1);
  CHECK(out[40] == 0);  // unwound at its barrier
  CHECK(out[50] == 0);
  std::vector<float> plain(256);
  D2L_LAUNCH(k::twice, 1, 256, 0, nullptr)(plain.data(), 256);  // the runner works again
  CHECK(plain[255] == 510.0f);
}

TEST_CASE("plain blocks over several OS threads" * doctest::test_suite("threads")) {
  cpu::ThreadPool pool{3};
  cpu::Ctx ctx{4, &pool};
  std::vector<float> out(16 * 256, 0.0f);
  emu::clear_block_counts();
  D2L_LAUNCH(k::late_barrier, 16, 256, 0, &ctx)(out.data(), 100, 7);
  const emu::BlockCounts c = emu::block_counts();
  CHECK(c.plain == 15);
  CHECK(c.fibers == 1);
  CHECK(out[7 * 256 + 100] == 101.0f);
  CHECK(out[7 * 256 + 255] == 100.0f);
  CHECK(out[8 * 256 + 5] == -5.0f);
}
