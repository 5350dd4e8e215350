// Philox4x32-10 (Salmon et al. 2011), the counter-based generator of kernels/cpu/rng.cpp, written
// once more for device code (__host__ __device__: the same function runs on the CPU for tests).
// It must give the same bits as the CPU's copy: keep the two line for line alike.
#pragma once
#include <cstdint>

namespace D2L_CUDA_NS {

struct PhiloxWords {
  uint32_t w[4];
};

// One Philox round: two 32x32->64 multiplies, then mix the halves with the other words and the key.
__host__ __device__ __forceinline__ PhiloxWords philox_round(const PhiloxWords& x, uint32_t k0, uint32_t k1) {
  const uint64_t p0 = uint64_t{0xD2511F53u} * x.w[0];
  const uint64_t p1 = uint64_t{0xCD9E8D57u} * x.w[2];
  const auto hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
  const auto hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
  return {{hi1 ^ x.w[1] ^ k0, lo1, hi0 ^ x.w[3] ^ k1, lo0}};
}

// Philox4x32-10 of counter (ctr, 0) (ctr in the first two words) under key seed.
__host__ __device__ __forceinline__ PhiloxWords philox4x32_10(uint64_t ctr, uint64_t seed) {
  PhiloxWords x = {{static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0u, 0u}};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;  // key schedule: bump before rounds 2..10
    x = philox_round(x, k0, k1);
  }
  return x;
}

}  // namespace D2L_CUDA_NS
