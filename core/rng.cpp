#include "core/rng.hpp"

#include <mutex>

namespace d2l {

namespace {
std::mutex mu;
uint64_t g_seed = 0, g_offset = 0;
}  // namespace

void manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu);
  g_seed = seed;
  g_offset = 0;
}

uint64_t current_seed() {
  std::lock_guard<std::mutex> lock(mu);
  return g_seed;
}

uint64_t take_offset(uint64_t n) {
  std::lock_guard<std::mutex> lock(mu);
  uint64_t o = g_offset;
  g_offset += n;
  return o;
}

RngState rng_state() {
  std::lock_guard<std::mutex> lock(mu);
  return {g_seed, g_offset};
}

void set_rng_state(RngState state) {
  std::lock_guard<std::mutex> lock(mu);
  g_seed = state.seed;
  g_offset = state.offset;
}

}  // namespace d2l
