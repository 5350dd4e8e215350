// The one random stream of a program: a seed and a counter. Each draw of n numbers takes the
// counter range [offset, offset + n); element i is Philox(seed, offset + i), so the values do not
// depend on the device, the number of threads or the launch shape.
#pragma once
#include <cstdint>

namespace d2l {

void manual_seed(uint64_t seed);  // also resets the counter
uint64_t current_seed();
// Reserves n numbers; returns the offset of the first.
uint64_t take_offset(uint64_t n);

}  // namespace d2l
