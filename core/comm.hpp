// Communication between devices (DESIGN.md "Communication"). data[i] lives on device i; after an
// allreduce every data[i] holds the sum over all devices, in place.
#pragma once
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

// The book's allreduce: add every device's copy into device 0, then copy the sum back into every
// device's tensor in place. Replicas are bitwise equal afterwards.
void allreduce_naive(const std::vector<Tensor>& data);

}  // namespace d2l
