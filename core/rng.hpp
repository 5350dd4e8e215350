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

// The whole state of the stream, for checkpoints: restoring it makes the next draws the same
// numbers they would have been.
struct RngState {
  uint64_t seed = 0;
  uint64_t offset = 0;  // the counter: where the next draw starts
};
RngState rng_state();
void set_rng_state(RngState state);

}  // namespace d2l
