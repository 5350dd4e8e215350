// Communication between devices (DESIGN.md "Communication"). data[i] lives on device i; after an
// allreduce every data[i] holds the sum over all devices, in place, bitwise equal on every device.
#pragma once
#include <string>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

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

}  // namespace d2l
