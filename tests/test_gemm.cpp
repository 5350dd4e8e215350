// The CPU GEMM family (kernels/cpu/gemm.cpp): kernel1 gemm_naive, kernel2 gemm_blocked, kernel3
// gemm_packed on every ISA this CPU runs (forced) and the portable one, OpenBLAS, and gemm (the choice),
// each against a direct triple loop in double (tests/check.hpp) and against kernel1, on the GEMMs of
// the chapters' networks (im2col's three passes for LeNet, the lab CNN, ResNet-18 and ResNet-50, the
// dense layers) and odd shapes (tall, skinny, 1xN, Nx1, K = 1, sizes no micro-tile divides), all four
// transpose combinations, alpha/beta != 1/0, empty dimensions; every member but OpenBLAS bitwise the
// same at 1, 2 and 3 threads.
#include <doctest/doctest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "check.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/cpu/thread_pool.hpp"

namespace cpu = d2l::kernels::cpu;

namespace {

using d2l::test::close;
using d2l::test::lcg_data;
using d2l::test::ref_gemm;

struct Shape {
  const char* what;
  int64_t M, N, K;
};
// im2col's passes of a conv with OC output channels, C*KH*KW = CKK window values and P positions
// (B images): forward (OC, P, CKK), backward_data (CKK, P, OC), backward_weight (OC, CKK, P).
const Shape kShapes[] = {
    {"1x1x1", 1, 1, 1}, {"odd", 3, 5, 7}, {"no tile divides", 67, 33, 129}, {"1xN", 1, 1000, 7},
    {"Nx1", 1000, 1, 7}, {"K = 1", 37, 45, 1}, {"tall", 1000, 3, 2}, {"skinny", 2, 67, 5}, {"7x1x33", 7, 1, 33},
    {"LeNet conv1 forward", 6, 784, 25}, {"LeNet conv1 backward_weight", 6, 25, 784},
    {"LeNet conv2 forward", 16, 100, 150}, {"LeNet conv2 backward_data", 150, 100, 16},
    {"lab CNN conv forward", 32, 196, 288}, {"LeNet dense", 64, 120, 400},
    {"ResNet-18 stage 1 forward", 64, 196, 576}, {"ResNet-18 stage 1 backward_weight", 64, 576, 196},
    {"ResNet-18 stage 2 backward_data", 1152, 49, 128}, {"ResNet-18 1x1 shortcut", 128, 49, 64},
    {"ResNet-18 stage 4 forward", 512, 16, 4608 / 8}, {"ResNet-18 dense", 256, 10, 512},
    {"ResNet-50 bottleneck 1x1", 256, 64, 64}, {"ResNet-50 3x3", 64, 256, 576},
};

// One product's inputs and what it must give: the double loop's result and kernel1's (computed
// once, then held against every member).
struct Expected {
  const Shape& s;
  bool ta, tb;
  float alpha, beta;
  std::vector<float> A, B, C;
  std::vector<double> ref;
  std::vector<float> naive;
  Expected(const cpu::Ctx& c, bool ta_, bool tb_, const Shape& s_, float alpha_, float beta_, uint32_t seed)
      : s(s_), ta(ta_), tb(tb_), alpha(alpha_), beta(beta_), A(lcg_data(s.M * s.K, seed)), B(lcg_data(s.K * s.N, seed + 1)),
        C(lcg_data(s.M * s.N, seed + 2)), ref(ref_gemm(ta, tb, s.M, s.N, s.K, alpha, A, B, beta, C)), naive(C) {
    cpu::gemm_naive(c, ta, tb, s.M, s.N, s.K, alpha, A.data(), B.data(), beta, naive.data());
  }
  // Member k's product on c, against both.
  bool check(const cpu::Ctx& c, cpu::GemmKernel k) const {
    std::vector<float> out = C;
    cpu::set_gemm_kernel(k);
    cpu::gemm(c, ta, tb, s.M, s.N, s.K, alpha, A.data(), B.data(), beta, out.data());
    cpu::set_gemm_kernel(cpu::GemmKernel::automatic);
    // float sums of K terms of size <= 1: atol 1e-5 * (K + 1); against kernel1 (float too) twice that
    const double atol = 1e-5 * static_cast<double>(s.K + 1);
    return close(ref, out, atol, 1e-5, "against the double reference") &&
           close(naive, out, 2 * atol, 1e-5, "against kernel1");
  }
};

bool compare_to_reference(const cpu::Ctx& c, cpu::GemmKernel k, bool ta, bool tb, const Shape& s, float alpha,
                          float beta, uint32_t seed) {
  return Expected(c, ta, tb, s, alpha, beta, seed).check(c, k);
}

// Calls f(s, ta, tb) for each shape and each of the four transpose combinations (all captured for the
// messages).
template <class F>
void for_shapes_and_transposes(std::span<const Shape> shapes, const F& f) {
  for (const Shape& s : shapes)
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(s.what);
        CAPTURE(ta);
        CAPTURE(tb);
        f(s, ta, tb);
      }
}

// Each member that the tests run, with the ISA it is forced to: kernel3 on every one this CPU has.
struct Member {
  cpu::GemmKernel kernel;
  cpu::VectorIsa isa;
  std::string name() const {
    std::string n = cpu::gemm_kernel_name(kernel);
    return kernel == cpu::GemmKernel::packed ? n + " " + cpu::vector_isa_name(isa) : n;
  }
};
std::vector<Member> members() {
  std::vector<Member> m{{cpu::GemmKernel::naive, cpu::best_vector_isa()},
                        {cpu::GemmKernel::blocked, cpu::best_vector_isa()}};
  for (cpu::VectorIsa isa : cpu::vector_isas()) m.push_back({cpu::GemmKernel::packed, isa});
  m.push_back({cpu::GemmKernel::openblas, cpu::best_vector_isa()});
  m.push_back({cpu::GemmKernel::automatic, cpu::best_vector_isa()});
  return m;
}

}  // namespace

TEST_CASE("every GEMM member matches the double reference and kernel1: the chapters' shapes, odd shapes, "
          "all transposes") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx two{2, &pool};
  uint32_t seed = 1;
  for_shapes_and_transposes(kShapes, [&](const Shape& s, bool ta, bool tb) {
    const Expected scaled(two, ta, tb, s, 0.75f, -0.5f, seed), plain(cpu::serial_ctx(), ta, tb, s, 1.0f, 0.0f, seed + 7);
    seed += 11;
    for (const Member& m : members()) {
      CAPTURE(m.name());
      cpu::set_gemm_isa(m.isa);
      CHECK(scaled.check(two, m.kernel));
      CHECK(plain.check(cpu::serial_ctx(), m.kernel));
    }
  });
  cpu::set_gemm_isa(cpu::best_vector_isa());
}

// kernel3's panels: products longer than one panel of the sum (KC = 192), wider than one of B's
// (NC = 4096) and taller than one block of A (MC), so that C takes several panels' sums in turn.
TEST_CASE("kernel3 across its panels and blocks, every ISA") {
  cpu::ThreadPool pool(2);
  const cpu::Ctx three{3, &pool};
  const Shape big[] = {{"K over 2 panels", 30, 70, 400}, {"N over 2 panels", 20, 4200, 3},
                       {"M over 3 blocks", 500, 40, 20}};
  for (cpu::VectorIsa isa : cpu::vector_isas()) {
    CAPTURE(cpu::vector_isa_name(isa));
    cpu::set_gemm_isa(isa);
    for_shapes_and_transposes(big, [&](const Shape& s, bool ta, bool tb) {
      CHECK(compare_to_reference(three, cpu::GemmKernel::packed, ta, tb, s, -1.25f, 1.0f, 91));
    });
  }
  cpu::set_gemm_isa(cpu::best_vector_isa());
}

TEST_CASE("kernels 1-3 give the same bits at 1, 2 and 3 threads") {
  cpu::ThreadPool pool(2);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}, cpu::Ctx{3, &pool}};
  const Shape shapes[] = {{"no tile divides", 67, 33, 129}, {"ResNet-18 backward_weight", 64, 576, 196},
                          {"over panels", 203, 300, 401}, {"skinny", 2, 1000, 65}};
  for (const Member& m : members()) {
    if (m.kernel == cpu::GemmKernel::openblas) continue;  // its blocks follow the thread count
    CAPTURE(m.name());
    cpu::set_gemm_isa(m.isa);
    cpu::set_gemm_kernel(m.kernel);
    for_shapes_and_transposes(shapes, [&](const Shape& s, bool ta, bool tb) {
      auto A = lcg_data(s.M * s.K, 3), B = lcg_data(s.K * s.N, 4), C0 = lcg_data(s.M * s.N, 5);
      std::vector<std::vector<float>> out;
      for (const cpu::Ctx& c : ctxs) {
        auto C = C0;
        cpu::gemm(c, ta, tb, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f, C.data());
        out.push_back(C);
      }
      CHECK(std::memcmp(out[0].data(), out[1].data(), out[0].size() * sizeof(float)) == 0);
      CHECK(std::memcmp(out[0].data(), out[2].data(), out[0].size() * sizeof(float)) == 0);
    });
  }
  cpu::set_gemm_kernel(cpu::GemmKernel::automatic);
  cpu::set_gemm_isa(cpu::best_vector_isa());
}

TEST_CASE("OpenBLAS's row and column splits agree with its serial result within rounding") {
  cpu::ThreadPool pool(1);
  cpu::Ctx two{2, &pool};
  for (Shape s : {Shape{"rows", 67, 33, 129}, Shape{"columns", 2, 1000, 65}}) {
    auto A = lcg_data(s.M * s.K, 21), B = lcg_data(s.K * s.N, 22), C1 = lcg_data(s.M * s.N, 23);
    auto C2 = C1;
    cpu::gemm_openblas(cpu::serial_ctx(), false, true, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f, C1.data());
    cpu::gemm_openblas(two, false, true, s.M, s.N, s.K, 0.5f, A.data(), B.data(), 2.0f, C2.data());
    CHECK(close(C1, C2, 1e-5 * (s.K + 1), 1e-5, "threads 1 vs 2"));
  }
}

TEST_CASE("every member with beta == 0 ignores NaN already in C, and handles empty dimensions") {
  cpu::ThreadPool pool(1);
  const cpu::Ctx ctxs[] = {cpu::serial_ctx(), cpu::Ctx{2, &pool}};
  for (const Member& m : members()) {
    CAPTURE(m.name());
    cpu::set_gemm_isa(m.isa);
    cpu::set_gemm_kernel(m.kernel);
    for (const auto& c : ctxs) {
      CAPTURE(c.threads);
      const int64_t M = 19, N = 37, K = 4;
      auto A = lcg_data(M * K, 5), B = lcg_data(K * N, 6);
      std::vector<float> C(M * N, std::numeric_limits<float>::quiet_NaN()), C0(M * N, 0.0f);
      const auto ref = ref_gemm(false, false, M, N, K, 2.0, A, B, 0.0, C0);
      cpu::gemm(c, false, false, M, N, K, 2.0f, A.data(), B.data(), 0.0f, C.data());
      CHECK(close(ref, C, 1e-5 * (K + 1), 1e-5, "beta = 0"));
      // K == 0: the product is empty, so C = beta * C.
      auto E = lcg_data(3 * 5, 9);
      std::vector<double> scaled(E.begin(), E.end());
      for (auto& v : scaled) v *= -0.5;
      cpu::gemm(c, false, false, 3, 5, 0, 1.0f, nullptr, nullptr, -0.5f, E.data());
      CHECK(close(scaled, E, 0.0, 0.0, "K = 0"));
      // K == 0 and beta == 0: C becomes zero even if it held NaN.
      std::vector<float> Cn(6, std::numeric_limits<float>::quiet_NaN());
      cpu::gemm(c, true, true, 2, 3, 0, 1.0f, nullptr, nullptr, 0.0f, Cn.data());
      for (float v : Cn) CHECK(v == 0.0f);
      // M == 0 or N == 0: nothing to write; C untouched (and no pointer read).
      std::vector<float> sentinel = {42.0f};
      cpu::gemm(c, false, false, 0, 1, 4, 1.0f, nullptr, nullptr, 0.0f, sentinel.data());
      cpu::gemm(c, true, false, 1, 0, 4, 1.0f, nullptr, nullptr, 0.0f, sentinel.data());
      CHECK(sentinel[0] == 42.0f);
    }
  }
  cpu::set_gemm_kernel(cpu::GemmKernel::automatic);
  cpu::set_gemm_isa(cpu::best_vector_isa());
}

TEST_CASE("the members by name: --gemm's CPU names and auto") {
  for (const char* n : {"naive", "blocked", "packed", "openblas", "auto"})
    CHECK(std::string(cpu::gemm_kernel_name(cpu::gemm_kernel_from_name(n))) == n);
  CHECK_THROWS(cpu::gemm_kernel_from_name("cublas"));
  CHECK(cpu::gemm_kernel_from_name("auto") == cpu::GemmKernel::automatic);
  // The default runs kernel3 at the CPU's widest vectors, whatever OpenBLAS guessed about the CPU.
  CHECK(cpu::gemm_vector_floats() == cpu::vector_isa_floats(cpu::best_vector_isa()));
  CHECK(cpu::gemm_description().find(cpu::vector_isa_name(cpu::best_vector_isa())) != std::string::npos);
}

// Devices call gemm from their own threads at the same time. Debian's serial OpenBLAS gave wrong
// results here (about 3 in 12000 calls from 8 threads: its buffer pool has no lock); the pthreads
// build pinned to one thread per call, or serialised calls, must give none, and kernel3's buffers are
// each call's own.
TEST_CASE("gemm called from 8 threads at once: every product right, OpenBLAS and the default") {
  for (cpu::GemmKernel k : {cpu::GemmKernel::openblas, cpu::GemmKernel::automatic}) {
    CAPTURE(cpu::gemm_kernel_name(k));
    cpu::set_gemm_kernel(k);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
      threads.emplace_back([t, &wrong] {
        for (int it = 0; it < 100; ++it) {
          const int64_t M = 16 + (it * 37 + t) % 150, N = 16 + (it * 53) % 130, K = 16 + (it * 29) % 200;
          auto A = lcg_data(M * K, 100 * t + it), B = lcg_data(K * N, 7 + it);
          std::vector<float> C(static_cast<size_t>(M * N));
          cpu::gemm(cpu::serial_ctx(), false, false, M, N, K, 1.0f, A.data(), B.data(), 0.0f, C.data());
          for (int64_t i = 0; i < M; i += 7)
            for (int64_t j = 0; j < N; j += 5) {
              double acc = 0;
              for (int64_t k = 0; k < K; ++k) acc += double(A[i * K + k]) * B[k * N + j];
              if (std::fabs(acc - C[i * N + j]) > 1e-4 * (1 + std::fabs(acc))) {
                wrong.fetch_add(1);
                i = M;  // one count per product
                break;
              }
            }
        }
      });
    for (auto& th : threads) th.join();
    CHECK(wrong.load() == 0);
  }
  cpu::set_gemm_kernel(cpu::GemmKernel::automatic);
}
