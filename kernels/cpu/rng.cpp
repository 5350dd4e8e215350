// Counter-based RNG (Philox4x32-10, Salmon et al. 2011): x (n) with element i drawn from the block
// for counter (offset + i) under key seed, so a value depends only on (seed, offset + i).
// normal: mean + stddev * N(0, 1) by Box-Muller;  uniform: lo + (hi - lo) * U[0, 1).
#include <array>
#include <cmath>
#include <numbers>

#include "kernels.hpp"

namespace d2l::kernels::cpu {

namespace {

using Words = std::array<uint32_t, 4>;

// One Philox round: two 32x32->64 multiplies, then mix the halves with the other words and the key.
Words philox_round(const Words& x, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t{0xD2511F53u} * x[0];
  const uint64_t p1 = uint64_t{0xCD9E8D57u} * x[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {hi1 ^ x[1] ^ k0, lo1, hi0 ^ x[3] ^ k1, lo0};
}

// Philox4x32-10 of counter (ctr, 0) (ctr in the first two words) under key seed.
Words philox4x32_10(uint64_t ctr, uint64_t seed) {
  Words x = {static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;  // key schedule: bump before rounds 2..10
    x = philox_round(x, k0, k1);
  }
  return x;
}

constexpr double kTwoPow24 = 16777216.0;

}  // namespace

void normal(const Ctx& c, float* x, int64_t n, uint64_t seed, uint64_t offset, float mean, float stddev) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Words w = philox4x32_10(offset + static_cast<uint64_t>(i), seed);
      const double u1 = ((w[0] >> 8) + 1) / kTwoPow24;  // in (0, 1]: log(u1) is finite
      const double u2 = (w[1] >> 8) / kTwoPow24;        // in [0, 1)
      const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
      x[i] = static_cast<float>(mean + stddev * z);
    }
  });
}

void uniform(const Ctx& c, float* x, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi) {
  c.parallel_for(n, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const Words w = philox4x32_10(offset + static_cast<uint64_t>(i), seed);
      const float u = static_cast<float>(w[0] >> 8) * (1.0f / 16777216.0f);  // 24 bits, exact, [0, 1)
      float v = lo + (hi - lo) * u;
      if (v >= hi && hi > lo) v = std::nextafter(hi, lo);  // float rounding could reach hi; keep [lo, hi)
      x[i] = v;
    }
  });
}

}  // namespace d2l::kernels::cpu
