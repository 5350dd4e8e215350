// Philox4x32-10 normal/uniform kernels: an independent Philox checked against Random123's published
// known-answer vectors, bitwise agreement with it, chunking and thread invariance, and moments.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <vector>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

namespace cpu = d2l::kernels::cpu;

namespace {

using Vec = std::vector<float>;

// Reference Philox4x32-10 over a full 4-word counter and 2-word key (Salmon et al., SC'11), written
// with 64-bit products split by hand and the key bumped after each round (Random123's order).
void philox_ref(const uint32_t in[4], const uint32_t key[2], uint32_t out[4]) {
  uint32_t x0 = in[0], x1 = in[1], x2 = in[2], x3 = in[3], k0 = key[0], k1 = key[1];
  for (int round = 0; round < 10; ++round) {
    const uint64_t a = static_cast<uint64_t>(x0) * 0xD2511F53ull, b = static_cast<uint64_t>(x2) * 0xCD9E8D57ull;
    const uint32_t y0 = uint32_t(b >> 32) ^ x1 ^ k0, y1 = uint32_t(b), y2 = uint32_t(a >> 32) ^ x3 ^ k1,
                   y3 = uint32_t(a);
    x0 = y0, x1 = y1, x2 = y2, x3 = y3;
    k0 += 0x9E3779B9u, k1 += 0xBB67AE85u;
  }
  out[0] = x0, out[1] = x1, out[2] = x2, out[3] = x3;
}

// The kernel's convention: counter (i as 64 bits, 0, 0), key = seed as two words.
void philox_at(uint64_t seed, uint64_t i, uint32_t out[4]) {
  const uint32_t in[4] = {uint32_t(i), uint32_t(i >> 32), 0, 0}, key[2] = {uint32_t(seed), uint32_t(seed >> 32)};
  philox_ref(in, key, out);
}

bool bitwise_equal(const Vec& a, const Vec& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

void moments(const Vec& x, double& mean, double& stddev) {
  double s = 0, s2 = 0;
  for (float v : x) s += v;
  mean = s / double(x.size());
  for (float v : x) s2 += (v - mean) * (v - mean);
  stddev = std::sqrt(s2 / double(x.size()));
}

}  // namespace

TEST_CASE("reference Philox4x32-10 reproduces Random123's known-answer vectors") {
  // Random123's known-answer file (kat_vectors), its "philox4x32 10" lines: counter[4] key[2] -> output[4].
  const uint32_t cases[3][10] = {
      {0, 0, 0, 0, 0, 0, 0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8},
      {~0u, ~0u, ~0u, ~0u, ~0u, ~0u, 0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd},
      {0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344, 0xa4093822, 0x299f31d0, 0xd16cfe09, 0x94fdcceb,
       0x5001e420, 0x24126ea1}};
  for (const auto& k : cases) {
    uint32_t out[4];
    philox_ref(k, k + 4, out);
    for (int j = 0; j < 4; ++j) CHECK(out[j] == k[6 + j]);
  }
  // The kernel on the all-zero vector: uniform's first word 0x6627e8d5 -> (w >> 8) * 2^-24.
  float u = -1.0f;
  cpu::uniform(cpu::serial_ctx(), &u, 1, 0, 0, 0.0f, 1.0f);
  CHECK(u == static_cast<float>((0x6627e8d5u >> 8) / 16777216.0));
}

TEST_CASE("uniform and normal match the reference bit for bit") {
  const uint64_t seed = 0x123456789abcdefull, offset = (1ull << 32) - 5;  // counters cross into word 1
  const int64_t n = 1037;
  Vec u(n), z(n);
  cpu::uniform(cpu::serial_ctx(), u.data(), n, seed, offset, -2.0f, 3.0f);
  cpu::normal(cpu::serial_ctx(), z.data(), n, seed, offset, 0.5f, 2.0f);
  int64_t bad_u = 0, bad_z = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w[4];
    philox_at(seed, offset + uint64_t(i), w);
    const float r = float((w[0] >> 8) * (1.0 / 16777216.0));
    const float ref_u = -2.0f + 5.0f * r;
    const double u1 = ((w[0] >> 8) + 1) / 16777216.0, u2 = (w[1] >> 8) / 16777216.0;
    const double zz = std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * std::numbers::pi * u2);
    const float ref_z = static_cast<float>(0.5 + 2.0 * zz);
    bad_u += u[i] != ref_u;
    bad_z += z[i] != ref_z;
  }
  CHECK(bad_u == 0);
  CHECK(bad_z == 0);
}

TEST_CASE("values depend only on (seed, offset + i): chunks and threads give identical bits") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx two{2, &pool};
  const int64_t n = 10007;
  const uint64_t seed = 42, offset = 1000;
  Vec whole(n), threaded(n), chunked(n), wu(n), tu(n), cu(n);
  cpu::normal(cpu::serial_ctx(), whole.data(), n, seed, offset, 0.0f, 1.0f);
  cpu::normal(two, threaded.data(), n, seed, offset, 0.0f, 1.0f);
  cpu::uniform(cpu::serial_ctx(), wu.data(), n, seed, offset, -1.0f, 1.0f);
  cpu::uniform(two, tu.data(), n, seed, offset, -1.0f, 1.0f);
  // Odd-sized chunks, each generated at its own offset, alternating 1 and 2 threads.
  int64_t pos = 0, step = 1, which = 0;
  while (pos < n) {
    const int64_t len = std::min(step, n - pos);
    const auto& c = (which++ % 2) ? two : cpu::serial_ctx();
    cpu::normal(c, chunked.data() + pos, len, seed, offset + uint64_t(pos), 0.0f, 1.0f);
    cpu::uniform(c, cu.data() + pos, len, seed, offset + uint64_t(pos), -1.0f, 1.0f);
    pos += len;
    step = step * 3 + 1;
  }
  CHECK(bitwise_equal(whole, threaded));
  CHECK(bitwise_equal(whole, chunked));
  CHECK(bitwise_equal(wu, tu));
  CHECK(bitwise_equal(wu, cu));
}

TEST_CASE("different seeds or offsets give different streams") {
  const int64_t n = 1000;
  Vec a(n), b(n), c(n);
  cpu::normal(cpu::serial_ctx(), a.data(), n, 1, 0, 0.0f, 1.0f);
  cpu::normal(cpu::serial_ctx(), b.data(), n, 2, 0, 0.0f, 1.0f);
  cpu::normal(cpu::serial_ctx(), c.data(), n, 1ull << 32, 0, 0.0f, 1.0f);  // high seed word only
  int64_t same_ab = 0, same_ac = 0;
  for (int64_t i = 0; i < n; ++i) same_ab += a[i] == b[i], same_ac += a[i] == c[i];
  CHECK(same_ab < 5);
  CHECK(same_ac < 5);
  // Offset n shifts the stream: element 0 at offset 7 equals element 7 at offset 0.
  Vec d(1);
  cpu::normal(cpu::serial_ctx(), d.data(), 1, 1, 7, 0.0f, 1.0f);
  CHECK(d[0] == a[7]);
}

TEST_CASE("moments: normal(0, 1) and normal(3, 0.5); uniform in [lo, hi)") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx two{2, &pool};
  const int64_t n = 100000;
  Vec x(n);
  double mean, stddev;
  cpu::normal(two, x.data(), n, 7, 0, 0.0f, 1.0f);
  moments(x, mean, stddev);
  CHECK(std::fabs(mean) < 0.01);  // standard error 0.003
  CHECK(std::fabs(stddev - 1.0) < 0.01);
  cpu::normal(two, x.data(), n, 8, 0, 3.0f, 0.5f);
  moments(x, mean, stddev);
  CHECK(std::fabs(mean - 3.0) < 0.005);
  CHECK(std::fabs(stddev - 0.5) < 0.005);
  int64_t non_finite = 0;
  for (float v : x) non_finite += !std::isfinite(v);
  CHECK(non_finite == 0);

  cpu::uniform(two, x.data(), n, 9, 0, -3.0f, 5.0f);
  int64_t outside = 0;
  for (float v : x) outside += !(v >= -3.0f && v < 5.0f);
  CHECK(outside == 0);
  moments(x, mean, stddev);
  CHECK(std::fabs(mean - 1.0) < 0.05);  // std error 8/sqrt(12 n) = 0.007
  CHECK(std::fabs(stddev - 8.0 / std::sqrt(12.0)) < 0.02);
}
