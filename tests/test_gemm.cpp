// gemm and kernel1 gemm_naive against a direct triple loop in double (tests/check.hpp): all four transpose combinations, odd shapes,
// alpha/beta != 1/0, empty dimensions, and 1 vs 2 device threads.
#include <doctest/doctest.h>

#include <cmath>
#include <atomic>
#include <limits>
#include <thread>
#include <vector>

#include "check.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/cpu/kernels.hpp"

namespace cpu = d2l::kernels::cpu;

namespace {

using d2l::test::close;
using d2l::test::lcg_data;

// C = alpha * op(A) @ op(B) + beta * C, everything in double, indexing the stored layouts directly.
using d2l::test::ref_gemm;

struct Shape {
  int64_t M, N, K;
};
const Shape kShapes[] = {{1, 1, 1}, {3, 5, 7}, {67, 33, 129}, {1, 1000, 7}, {2, 67, 5},
                         {1000, 3, 2}, {7, 1, 33}, {33, 7, 1}};

// Runs gemm for one shape/transpose/alpha/beta and compares with the reference.
// Tolerance: float accumulation over K terms of size <= 1 -> atol 1e-5 * (K + 1), rtol 1e-5.
using Gemm = decltype(&cpu::gemm);
bool run_case(const cpu::Ctx& c, bool ta, bool tb, Shape s, float alpha, float beta, uint32_t seed,
              Gemm gemm = cpu::gemm) {
  auto A = lcg_data(s.M * s.K, seed), B = lcg_data(s.K * s.N, seed + 1), C = lcg_data(s.M * s.N, seed + 2);
  auto ref = ref_gemm(ta, tb, s.M, s.N, s.K, alpha, A, B, beta, C);
  gemm(c, ta, tb, s.M, s.N, s.K, alpha, A.data(), B.data(), beta, C.data());
  return close(ref, C, 1e-5 * static_cast<double>(s.K + 1), 1e-5, "gemm");
}

}  // namespace

// Calls f(c, ta, tb, shape, seed) for 1 and 2 threads, all four transposes and every shape.
template <class F>
void for_each_case(uint32_t seed, const F& f) {
  cpu::ThreadPool pool(1);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
  for (const auto& c : ctxs)
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (const Shape& s : kShapes) {
          CAPTURE(c.threads);
          CAPTURE(ta);
          CAPTURE(tb);
          CAPTURE(s.M);
          CAPTURE(s.N);
          CAPTURE(s.K);
          f(c, ta, tb, s, seed);
          seed += 3;
        }
}

TEST_CASE("gemm matches the double reference: all transposes, odd shapes, threads 1 and 2") {
  for_each_case(1, [](const cpu::Ctx& c, bool ta, bool tb, Shape s, uint32_t seed) {
    CHECK(run_case(c, ta, tb, s, 0.75f, -0.5f, seed));
    CHECK(run_case(c, ta, tb, s, 1.0f, 0.0f, seed + 7));
    CHECK(run_case(c, ta, tb, s, -1.25f, 1.0f, seed + 13));
  });
}

TEST_CASE("kernel1 gemm_naive matches the double reference, and gemm matches it") {
  for_each_case(5, [](const cpu::Ctx& c, bool ta, bool tb, Shape s, uint32_t seed) {
    CHECK(run_case(c, ta, tb, s, 0.75f, -0.5f, seed, cpu::gemm_naive));
    CHECK(run_case(c, ta, tb, s, 1.0f, 0.0f, seed + 7, cpu::gemm_naive));
    // the tuned path against the readable one, both in float
    auto A = lcg_data(s.M * s.K, seed), B = lcg_data(s.K * s.N, seed + 1), C = lcg_data(s.M * s.N, seed + 2);
    auto C2 = C;
    cpu::gemm_naive(c, ta, tb, s.M, s.N, s.K, 1.5f, A.data(), B.data(), 0.5f, C.data());
    cpu::gemm(c, ta, tb, s.M, s.N, s.K, 1.5f, A.data(), B.data(), 0.5f, C2.data());
    CHECK(close(C, C2, 2e-5 * static_cast<double>(s.K + 1), 1e-5, "gemm vs gemm_naive"));
  });
}

TEST_CASE("gemm with beta == 0 ignores NaN already in C") {
  cpu::ThreadPool pool(1);
  cpu::Ctx c{2, &pool};
  const int64_t M = 9, N = 11, K = 4;
  auto A = lcg_data(M * K, 5), B = lcg_data(K * N, 6);
  std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN()), C0(M * N, 0.0f);
  auto ref = ref_gemm(false, false, M, N, K, 2.0, A, B, 0.0, C0);
  cpu::gemm(c, false, false, M, N, K, 2.0f, A.data(), B.data(), 0.0f, C.data());
  CHECK(close(ref, C, 1e-5 * (K + 1), 1e-5, "gemm beta=0"));
}

TEST_CASE("gemm with an empty dimension") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
  for (const auto& c : ctxs) {
    CAPTURE(c.threads);
    // K == 0: the product is empty, so C = beta * C.
    auto C = lcg_data(3 * 5, 9);
    std::vector<double> ref(C.begin(), C.end());
    for (auto& v : ref) v *= -0.5;
    cpu::gemm(c, false, false, 3, 5, 0, 1.0f, nullptr, nullptr, -0.5f, C.data());
    CHECK(close(ref, C, 0.0, 0.0, "K=0"));
    // K == 0 and beta == 0: C becomes zero even if it held NaN.
    std::vector<float> Cn(6, std::numeric_limits<float>::quiet_NaN());
    cpu::gemm(c, true, true, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, Cn.data());
    for (float v : Cn) CHECK(v == 0.0f);
    // M == 0 or N == 0: nothing to write; C must be untouched (and no pointer read).
    std::vector<float> sentinel = {42.0f};
    cpu::gemm(c, false, false, 0, 1, 4, 1.0f, nullptr, nullptr, 0.0f, sentinel.data());
    cpu::gemm(c, true, false, 1, 0, 4, 1.0f, nullptr, nullptr, 0.0f, sentinel.data());
    CHECK(sentinel[0] == 42.0f);
  }
}

TEST_CASE("gemm row and column splits agree with the serial result within rounding") {
  // gemm is the one kernel not promised bitwise thread-invariant (OpenBLAS blocks); check 1 vs 2
  // threads agree closely on a row-split shape and a column-split shape.
  cpu::ThreadPool pool(1);
  cpu::Ctx two{2, &pool};
  for (Shape s : {Shape{67, 33, 129}, Shape{2, 1000, 65}}) {
    auto A = lcg_data(s.M * s.K, 21), B = lcg_data(s.K * s.N, 22), C1 = lcg_data(s.M * s.N, 23);
    auto C2 = C1;
    cpu::gemm(cpu::serial_ctx(), false, true, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f,
                   C1.data());
    cpu::gemm(two, false, true, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f, C2.data());
    CHECK(close(C1, C2, 1e-5 * (s.K + 1), 1e-5, "threads 1 vs 2"));
  }
}

// Devices call gemm from their own threads at the same time. Debian's serial OpenBLAS gave wrong
// results here (about 3 in 12000 calls from 8 threads: its buffer pool has no lock); the pthreads
// build pinned to one thread per call, or serialised calls, must give none.
TEST_CASE("gemm called from 8 threads at once: every product right") {
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([t, &wrong] {
      for (int it = 0; it < 150; ++it) {
        Shape s{16 + (it * 37 + t) % 150, 16 + (it * 53) % 130, 16 + (it * 29) % 200};
        auto A = lcg_data(s.M * s.K, 100 * t + it), B = lcg_data(s.K * s.N, 7 + it);
        std::vector<float> C(static_cast<size_t>(s.M * s.N));
        cpu::gemm(cpu::serial_ctx(), false, false, s.M, s.N, s.K, 1.0f, A.data(), B.data(), 0.0f, C.data());
        for (int64_t i = 0; i < s.M; i += 7)
          for (int64_t j = 0; j < s.N; j += 5) {
            double acc = 0;
            for (int64_t k = 0; k < s.K; ++k) acc += double(A[i * s.K + k]) * B[k * s.N + j];
            if (std::fabs(acc - C[i * s.N + j]) > 1e-4 * (1 + std::fabs(acc))) {
              wrong.fetch_add(1);
              i = s.M;  // one count per product
              break;
            }
          }
      }
    });
  for (auto& th : threads) th.join();
  CHECK(wrong.load() == 0);
}
