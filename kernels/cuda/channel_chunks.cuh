// Per-channel passes over an (N, C, HW) tensor in chunks (after d2l_cuda.cuh, inside D2L_CUDA_NS):
// used by batch_norm.cu and bias_add.cu, whose sums run over the M = N*HW values of one channel.
//
// One block per channel (grid = C) leaves most of a GPU idle when C is small next to the SM count
// (256 channels, 132 SMs: under two blocks an SM), and each block walks a whole channel alone. Here a
// channel's values are cut into chunks and the grid is 2-D:
//   blockIdx.x = the chunk,   blockIdx.y = the channel (in slices of at most 65535 channels)
// so a channel of 64 x 28 x 28 values gets 13 blocks on a GPU, and every block does the same
// amount of work.
//
// Loads. A channel's values form N planes of HW contiguous floats, plane n at x[(n C + c) HW]. When
// HW is a multiple of 4 and the tensors are 16-byte aligned, every plane starts 16-byte aligned and
// one float4 load moves 4 values ("vec" = 4); otherwise a load moves one float (vec = 1). A channel
// then has U = N * P loads, P = HW / vec a plane, numbered u = n P + j (plane n, load j in it).
//
// Chunks. Chunk b holds the loads [b L, (b + 1) L), L = blockDim.x * kLoadsPerThread; the last chunk
// of a channel may be shorter. Thread t takes the loads b L + t + k blockDim.x, k < kLoadsPerThread:
// at each k the block's threads read consecutive loads, so a warp reads consecutive memory inside a
// plane. A thread finds its plane with one 32-bit division, for its first load; between its loads it
// moves on by blockDim.x = step_planes P + step_in_plane loads with additions and one compare, so
// no load pays a division (the one-block-per-channel kernels paid a 64-bit division and modulo for
// every value).
//
// The chunks depend on the shape and the build only (never on the device or its threads), so a
// pass's partial results, combined in chunk order, have the same bits on every run.
#pragma once
#include <climits>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace D2L_CUDA_NS {

// Loads a thread makes in a chunk:
//   GPU        4 (float4 loads: 16 values a thread, 4096 a block of 256 threads): a 64 x 28 x 28
//              channel is 13 chunks, 256 channels 3328 blocks for 132 SMs;
//   emulated   64 (2048 loads a block of 32 threads): every emulated block pays fiber switches at its
//              barriers, so the emulation keeps the chunks few and long.
#ifdef __CUDACC__
constexpr int kLoadsPerThread = 4;
#else
constexpr int kLoadsPerThread = 64;
#endif

// The geometry of the chunks, computed once by the launcher (channel_chunks) and passed by value.
struct ChannelChunks {
  int64_t C, HW;       // the tensor is (N, C, HW)
  int vec;             // values a load moves: 4 (float4) or 1
  int plane_loads;     // P = HW / vec
  int loads;           // U = N * P, a channel's loads
  int chunk_loads;     // L = threads * kLoadsPerThread, a full chunk's loads
  int chunks;          // chunks a channel: ceil(U / L)
  int step_planes;     // threads = step_planes * P + step_in_plane
  int step_in_plane;
};

// True when p is 16-byte aligned (or null: a tensor the pass does not read).
inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

// The chunks of an (N, C, HW) tensor for blocks of `threads` threads. vec4: the caller's pointers
// are all 16-byte aligned. A channel may hold at most 2^30 values, so that every load index of it is a
// 32-bit int.
inline ChannelChunks channel_chunks(const char* op, int64_t N, int64_t C, int64_t HW, int threads, bool vec4) {
  if (N * HW > (int64_t{1} << 30))
    throw std::invalid_argument(std::string(op) + ": " + std::to_string(N * HW) +
                                " values a channel; the CUDA kernels take at most 2^30");
  ChannelChunks w{};
  w.C = C;
  w.HW = HW;
  w.vec = vec4 && HW % 4 == 0 ? 4 : 1;
  w.plane_loads = static_cast<int>(HW / w.vec);
  w.loads = static_cast<int>(N) * w.plane_loads;
  w.chunk_loads = threads * kLoadsPerThread;
  w.chunks = (w.loads + w.chunk_loads - 1) / w.chunk_loads;
  w.step_planes = threads / w.plane_loads;
  w.step_in_plane = threads % w.plane_loads;
  return w;
}

// Runs launch(first_channel, count) for the channels in slices of at most 65535, the limit of
// gridDim.y.
template <class Launch>
void for_channel_slices(int64_t C, Launch launch) {
  constexpr int64_t kMaxGridY = 65535;
  for (int64_t c0 = 0; c0 < C; c0 += kMaxGridY) launch(c0, C - c0 < kMaxGridY ? C - c0 : kMaxGridY);
}

// The values in chunk `chunk` of a channel (the last one may hold fewer than L loads).
__device__ __forceinline__ int chunk_values(const ChannelChunks& w, int chunk) {
  const int left = w.loads - chunk * w.chunk_loads;
  return (left < w.chunk_loads ? left : w.chunk_loads) * w.vec;
}

// The index in the tensor of the first value of load u = n P + j (plane n, load j) of channel ch.
__device__ __forceinline__ int64_t load_index(const ChannelChunks& w, int64_t ch, int n, int j) {
  return (n * w.C + ch) * w.HW + static_cast<int64_t>(j) * w.vec;
}

// Calls visit(index) for each of this thread's loads in chunk `chunk` of channel ch, index being
// the position in the tensor of the load's first value, in the thread's order k = 0, 1, ...
template <class Visit>
__device__ __forceinline__ void for_thread_loads(const ChannelChunks& w, int64_t ch, int chunk, Visit visit) {
  const int first = chunk * w.chunk_loads + static_cast<int>(threadIdx.x);  // load index u in the channel
  int n = first / w.plane_loads;      // its plane: the thread's only division
  int j = first - n * w.plane_loads;  // and its load in the plane
#ifdef __CUDACC__
#pragma unroll  // 4 independent loads in flight (the emulation's 64 stay a loop)
#endif
  for (int k = 0; k < kLoadsPerThread; ++k) {
    if (first + k * static_cast<int>(blockDim.x) >= w.loads) return;  // past the channel's end
    visit(load_index(w, ch, n, j));
    n += w.step_planes;  // on by blockDim.x loads
    j += w.step_in_plane;
    if (j >= w.plane_loads) {
      j -= w.plane_loads;
      ++n;
    }
  }
}

// The index in the tensor of the first value of chunk `chunk` of channel ch.
__device__ __forceinline__ int64_t chunk_start(const ChannelChunks& w, int64_t ch, int chunk) {
  const int first = chunk * w.chunk_loads, n = first / w.plane_loads;
  return load_index(w, ch, n, first - n * w.plane_loads);
}

// Reads one load (w.vec values) at p into v[0 .. vec); writes one load from v. With vec 1, v[1 .. 4)
// are left as they were (callers loop over all 4 so that v stays in registers: indices known at
// compile time).
__device__ __forceinline__ void load_values(const float* p, int vec, float (&v)[4]) {
  if (vec == 4) {
    const float4 q = __ldg(reinterpret_cast<const float4*>(p));
    v[0] = q.x;
    v[1] = q.y;
    v[2] = q.z;
    v[3] = q.w;
  } else {
    v[0] = __ldg(p);
  }
}
__device__ __forceinline__ void store_values(float* p, int vec, const float (&v)[4]) {
  if (vec == 4)
    *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
  else
    *p = v[0];
}

}  // namespace D2L_CUDA_NS
