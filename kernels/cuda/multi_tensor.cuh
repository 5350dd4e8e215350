// One launch over a list of tensors (after d2l_cuda.cuh and common.cuh, inside D2L_CUDA_NS), as PyTorch's
// torch._foreach_* and apex's multi_tensor_apply do: the optimizer's update of every parameter on a
// device in one kernel, where the per-tensor step launches one kernel (Adam) or four (SGD) per parameter.
//
// The kernel's launch argument is a table of at most kMaxTensorsPerLaunch tensors (kernels.hpp): for each,
// one pointer per list (SGD's lists are w, mom and g) and its number of elements. Each tensor is cut into
// chunks of kChunk elements, its last chunk shorter, an empty tensor none; the chunks of the table are
// numbered one after the other, and block b takes chunks b, b + gridDim.x, b + 2 gridDim.x, ...
//
//   tensor             0              1       2 (empty)      3
//   its chunks      0   1   2         3                    4   5
//   first_chunk = {0, 3, 4, 4, 6}    (first_chunk[t]: the chunks before tensor t; the last entry: all 6)
//
// Chunk c belongs to the last tensor t with first_chunk[t] <= c (chunk_at). A list longer than
// kMaxTensorsPerLaunch is cut into several tables, one launch each (for_each_table).
//
// The table travels as a kernel argument (CUDA copies the arguments to the GPU with the launch), so no
// device buffer and no copy are needed: Adam's table of 4 lists, 64 * (4 pointers + 2 int64) + 8 bytes,
// is 3 KiB, under the 4 KiB CUDA allows for a kernel's arguments on every version.
#pragma once
#include <cstdint>

namespace D2L_CUDA_NS {

// Elements a block updates before taking its next chunk: 16 per thread of a 256-thread block.
constexpr int64_t kChunk = 4096;

template <int kLists>
struct TensorTable {
  float* ptr[kLists][kMaxTensorsPerLaunch];        // ptr[l][t]: list l's array for tensor t
  int64_t n[kMaxTensorsPerLaunch];                 // tensor t's elements
  int64_t first_chunk[kMaxTensorsPerLaunch + 1];   // chunks before tensor t; [count]: the table's chunks
  int count = 0;                                   // tensors in the table
  int64_t chunks = 0;                              // first_chunk[count]
};

// The elements [begin, end) of tensor `tensor` that chunk c covers.
struct Chunk {
  int tensor;
  int64_t begin, end;
};

template <int kLists>
__device__ __forceinline__ Chunk chunk_at(const TensorTable<kLists>& table, int64_t c) {
  int t = 0;
  while (table.first_chunk[t + 1] <= c) ++t;  // passes over empty tensors too: they own no chunk
  const int64_t begin = (c - table.first_chunk[t]) * kChunk;
  const int64_t end = begin + kChunk < table.n[t] ? begin + kChunk : table.n[t];
  return Chunk{t, begin, end};
}

// Host side: fills tables from the lists (lists[l][i]: list l's array for tensor i of n[i] elements,
// i < count) and calls launch(table, grid) for each table that has a chunk to update. grid: one block per
// chunk, at most kMaxBlocks (common.cuh; the blocks then loop over the chunks).
template <int kLists, class Launch>
void for_each_table(float* const* const (&lists)[kLists], const int64_t* n, int64_t count, Launch launch) {
  for (int64_t first = 0; first < count; first += kMaxTensorsPerLaunch) {
    TensorTable<kLists> table;
    table.first_chunk[0] = 0;
    for (int64_t i = first; i < count && table.count < kMaxTensorsPerLaunch; ++i) {
      const int t = table.count++;
      for (int l = 0; l < kLists; ++l) table.ptr[l][t] = lists[l][i];
      table.n[t] = n[i];
      table.first_chunk[t + 1] = table.first_chunk[t] + (n[i] + kChunk - 1) / kChunk;
    }
    table.chunks = table.first_chunk[table.count];
    if (table.chunks > 0) launch(table, static_cast<unsigned>(table.chunks < kMaxBlocks ? table.chunks : kMaxBlocks));
  }
}

}  // namespace D2L_CUDA_NS
