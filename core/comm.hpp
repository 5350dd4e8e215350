// Communication between devices (README.md "Processes and machines (MPI)" for the processes). data[i] lives on device i; after an
// allreduce every data[i] holds the sum over all devices, in place, bitwise equal on every device.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

// The one split rule of every collective and every shard (the ring's chunks here, dist::allgather's
// and dist::reduce_scatter's chunks over the ranks, ZeRO's shards over devices or ranks): n elements
// cut into `chunks` contiguous ranges, range c = [chunk_begin(n, c, chunks), chunk_begin(n, c + 1,
// chunks)), that is n * c / chunks rounded down: sizes differ by at most one, and a range is empty
// where n < chunks.
int64_t chunk_begin(int64_t n, int64_t chunk, int64_t chunks);

// The book's allreduce: add every device's copy into device 0, then copy the sum back into every
// device's tensor in place. Device 0 receives (n-1) and sends (n-1) full copies.
void allreduce_naive(const std::vector<Tensor>& data);

// Ring allreduce: the data is cut into n chunks; n-1 reduce-scatter steps (device i passes its
// running sum of one chunk to device i+1, which adds its own) leave device i with the full sum of
// chunk i+1; n-1 all-gather steps pass the finished chunks around the ring. Every device sends
// 2(n-1)/n of the data, whatever n: no device is a bottleneck.
void allreduce_ring(const std::vector<Tensor>& data);

// "naive" or "ring"; anything else is a ConfigError naming the choices.
void allreduce(const std::vector<Tensor>& data, const std::string& algorithm);

// Reduce-scatter, the first half of an allreduce kept apart (ZeRO stage 2 sums its gradients with
// it): every device holds a flat vector of P elements, the same P on each; bounds (n + 1 offsets,
// 0 first, P last, never decreasing) cut it into n shards, shard i = [bounds[i], bounds[i + 1]),
// of any sizes, empty ones included. Afterwards out[i], a flat float32 tensor of shard i's size on
// device i, holds the sum over all devices of their elements of shard i; nobody holds the whole sum.
// data[i] is device i's vector given as pieces laid end to end (ZeRO's parameters' gradients, in
// order), so no device first copies its P elements into one buffer.
//
// The direct algorithm: device i fetches its shard from every device and adds the copies in device
// order, data[0] + data[1] + ... + data[n-1], the order of the 'device' kvstore's sum, so each element
// of the result has the bits an allreduce by that kvstore would give it. Device i receives (n-1)
// shards of its own size and sends the other devices their shards of its vector: with equal shards,
// (n-1)/n of the data in and out on every device, half of what an allreduce moves, as in the ring.
void reduce_scatter(const std::vector<std::vector<Tensor>>& data, const std::vector<int64_t>& bounds,
                    const std::vector<Tensor>& out);
// The same for one tensor a device (data[i] of any shape, flattened): returns out.
std::vector<Tensor> reduce_scatter(const std::vector<Tensor>& data, const std::vector<int64_t>& bounds);

}  // namespace d2l
