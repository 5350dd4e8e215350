// Collectives across the processes of the world (README.md "Processes and machines (MPI)"), beside the
// in-process ones of core/comm.hpp. Every rank calls each collective in the same order with tensors
// of the same shape. They are stream work: the communication thread (core/dist/process_group.hpp)
// starts after the tensor's compute stream reaches this point, and the compute stream waits for
// the result; the host thread only enqueues. cpu(i) and emu(i) tensors (host memory) go through MPI,
// gpu(i) tensors through NCCL (core/dist/nccl.hpp) in a build that has it, otherwise through MPI
// via a copy in host memory. The ring always runs over MPI (a GPU tensor's sum is staged on the host).
//
// Every collective also runs over a process group (core/dist/group.hpp): the same collective among
// the group's ranks only, its rank order and its chunks the group's (a grid's dp group, for
// ZeRO over it). Without a group they run over the world.
//
// A tensor of N elements is cut into world_size() chunks, chunk c = [chunk_begin(N, c), chunk_begin(N, c+1)),
// sizes differing by at most one (N need not divide). In a world of one every collective is a copy or nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dist/group.hpp"
#include "core/stream.hpp"
#include "core/tensor.hpp"

namespace d2l::dist {

int64_t chunk_begin(int64_t n, int chunk);                     // n * chunk / world_size()
int64_t chunk_begin(int64_t n, int chunk, const Group& group);  // the same rule over a group: n * chunk / group.size()
// Per member of the group, how many of the elements [a, b) of n lie in its chunk: the counts that
// hand a part of a chunked vector to allgather_async and reduce_scatter_async (ZeRO over the ranks
// gathers and reduce-scatters parameter by parameter with them).
std::vector<int64_t> counts_in_chunks(int64_t n, int64_t a, int64_t b, const Group& group);

// In place: t becomes the sum over the ranks of t, with the same bits on every rank. t is float32, or
// bfloat16 or float16 (DDP's compression hooks, core/dist/buckets.hpp): half the bytes, each addition
// made in float32 and rounded back to the 16-bit format, as NCCL's 16-bit sums (MPI_Allreduce gets an
// operation of ours on the bits).
//   library  MPI_Allreduce (ncclAllReduce for GPU tensors)
//   ring     the book's ring over MPI point-to-point: W-1 reduce-scatter steps (rank r passes its
//            running sum of one chunk to r+1, which adds its own), then W-1 all-gather steps passing
//            the finished chunks on. Each chunk is summed by one owner and copied to the others,
//            so every rank ends with the same bits whatever the library does.
//   naive    the book's first idea: every rank sends its whole tensor to rank 0, which adds them in
//            rank order and sends the sum back to each (2(W-1) messages of the whole size through one rank)
void allreduce(const Tensor& t, const std::string& algorithm = "library");
// The same over the ranks of `group` only (the ring's chunks and the naive root are the group's).
// GPU tensors use NCCL for the world only; a smaller group's sum is staged through host memory.
void allreduce(const Tensor& t, const Group& group, const std::string& algorithm = "library");

// The same allreduce without making the tensor's compute stream wait for it: the result is there
// once work.wait() has been called (it orders the compute stream after the collective; the host
// never waits), which DDP's buckets (core/dist/buckets.hpp) do at the end of backward.
struct Work {
  Device device;
  Event done;
  bool pending = false;  // false: nothing to wait for (a world of one)
  void wait() const;
};
Work allreduce_async(const Tensor& t, const std::string& algorithm = "library");

// A modelled network between the ranks (chapter 4): when gbps > 0 or latency_us > 0, each
// allreduce on the communication thread lasts at least what its messages would take on such a link,
// one after another: the ring 2(W-1) messages of n/W bytes, naive 2(W-1) of n bytes, and the library
// is modelled as the ring. A message costs latency_us + bytes / (gbps * 1e9 / 8) seconds. The real
// transfer (shared memory) runs first; the thread then sleeps out the rest. Off (0, 0) by default.
struct LinkModel {
  double gbps = 0, latency_us = 0;
  bool on() const { return gbps > 0 || latency_us > 0; }
};
void set_link_model(LinkModel m);
LinkModel link_model();
// The modelled seconds of one allreduce of `bytes` with `algorithm` over world_size() ranks.
double modeled_allreduce_seconds(const LinkModel& m, double bytes, const std::string& algorithm, int world);
// t on every rank becomes root's t (root: a rank of the group).
void broadcast(const Tensor& t, int root = 0);
void broadcast(const Tensor& t, int root, const Group& group);
// out (N elements, any shape) becomes the concatenation of every rank's `in`; rank r's `in` holds
// chunk r's elements (chunk_begin(N, r+1) - chunk_begin(N, r)).
void allgather(const Tensor& in, const Tensor& out);
void allgather(const Tensor& in, const Tensor& out, const Group& group);  // chunk_begin(N, r, group)'s split
// The same all-gather without making the compute stream wait for it (FSDP's prefetch, core/optim/zero.hpp):
// `out` holds the result once work.wait() has been called. GPU tensors: as allgather (nothing pending).
Work allgather_async(const Tensor& in, const Tensor& out);
// The all-gather with the split given (MPI_Allgatherv): counts[r] elements (summing to out's) come
// from rank r, this rank's read from `in` at element in_offset on; out is their concatenation in
// rank order. ZeRO over the ranks gathers each parameter straight into its tensor with it
// (core/optim/zero.hpp). GPU tensors go through host memory, and then the compute stream waits.
// Over a group, counts has one entry per member, in group rank order. `in` may be `out` itself,
// this rank's part already in its place (MPI_IN_PLACE): a parameter updated in place is gathered so.
Work allgather_async(const Tensor& in, int64_t in_offset, const Tensor& out, const std::vector<int64_t>& counts,
                     const Group& group = Group());
// out (rank r: chunk r's elements) becomes the sum over the ranks of chunk r of `in` (N elements).
void reduce_scatter(const Tensor& in, const Tensor& out);
// The same with the split given: counts[r] elements (summing to in's) go to rank r, this rank's into
// out from element out_offset on (MPI_Reduce_scatter's uneven counts), and the compute stream does
// not wait for it: the sum is there once the Work's wait() has run (ZeRO-2's per-gradient
// reduce-scatter during backward, core/optim/zero.hpp). GPU tensors go through host memory,
// and then the compute stream waits. in_offset >= 0: the elements reduced are in's from in_offset on
// (one parameter of a packed bucket, each received straight into its own tensor); else all of in.
Work reduce_scatter_async(const Tensor& in, const Tensor& out, int64_t out_offset, const std::vector<int64_t>& counts,
                          const Group& group = Group(), int64_t in_offset = -1);
// What this process handed to the collectives on tensors, counted per kind since the last reset
// (calls that communicate only: a world or group of one, or an empty tensor, counts nothing). For a
// call on n elements (4 n bytes; 2 n for a 16-bit allreduce, and so below) among W ranks, c_r this
// rank's chunk (chunk_begin's split):
//   input_bytes  the bytes of the send buffer this rank gave the call: 4 n for allreduce and
//                reduce-scatter, 4 c_r for all-gather, 4 n for broadcast (every rank's buffer);
//   sent_bytes   the bytes that leave this rank when the collective runs as the ring does, every
//                element of a chunk crossing each link once:
//                  reduce-scatter  4 (n - c_r): every chunk but its own goes out, once;
//                  all-gather      4 c_r (W-1): its own chunk, to each of the others;
//                  allreduce       a reduce-scatter, then an all-gather: 4 (n - c_r) + 4 c_r (W-1);
//                  broadcast       4 n (W-1) from the root (it sends the tensor to each rank), 0 from the others.
// Over the ranks the c_r add up to n, so the total sent is (W-1) 4 n for a reduce-scatter or an
// all-gather of n elements and 2 (W-1) 4 n for an allreduce: per rank on average (W-1)/W of 4 n and
// of 2 * 4 n, the paper's volumes (Rajbhandari et al., SC20, section 7: data parallelism and ZeRO
// stages 1 and 2 move 2 Psi per step, stage 3 3 Psi, times (W-1)/W). Whatever the library really
// does (MPI_Allreduce's own algorithms, NCCL's), these are the sizes handed to it, per this rule.
// The host-value collectives (sum_over_ranks, broadcast_bytes, gather_strings, barrier) are not counted.
struct CollectiveCounter {
  int64_t calls = 0;
  int64_t input_bytes = 0;
  int64_t sent_bytes = 0;
};
struct CollectiveCounters {
  CollectiveCounter allreduce, reduce_scatter, allgather, broadcast;
  int64_t sent_bytes() const {
    return allreduce.sent_bytes + reduce_scatter.sent_bytes + allgather.sent_bytes + broadcast.sent_bytes;
  }
};
CollectiveCounters collective_counters();
void reset_collective_counters();

// Returns when every rank has called it (the host waits; devices are not involved).
void barrier();
void barrier(const Group& group);

// Hierarchical data parallelism: local[i] lives on this process's device i. The devices are summed
// inside the process first (core/comm.hpp's `local_algorithm`: naive or ring), then local[0] across
// the processes (`algorithm`), then copied back: every local[i] of every rank ends with the same bits.
void allreduce(const std::vector<Tensor>& local, const std::string& local_algorithm, const std::string& algorithm);

// Host values, summed over the ranks in rank order (the host waits): losses, correct counts.
std::vector<double> sum_over_ranks(std::vector<double> values);
std::vector<double> sum_over_ranks(std::vector<double> values, const Group& group);  // in group rank order
// n bytes at p on every rank become root's (the host waits): small host values such as NCCL's id.
void broadcast_bytes(void* p, size_t n, int root);
// Every rank's string, in rank order (the host waits).
std::vector<std::string> gather_strings(const std::string& mine);

// "library", "ring" or "naive"; anything else is a ConfigError naming the flag and the choices.
void check_algorithm(const std::string& flag, const std::string& algorithm);

}  // namespace d2l::dist
