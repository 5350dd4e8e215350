// Helpers for running an op's emulated CUDA kernels (kernels/cuda/<op>.cu compiled by g++ against
// kernels/emu, namespace d2l::kernels::emu) against its kernels/cpu twin, itself tested against
// independent double loops: bitwise comparison, a two-thread emulated device, and finite differences
// of the emulated forward with a negative control. Used by tests/test_<op>.cpp and tests/test_emu_ops*.cpp.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/parallel.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/kernels.hpp"

namespace d2l::test {

namespace kemu = d2l::kernels::emu;

// A 2-thread emu device (the "threads" cases): blocks spread over two OS threads.
struct TwoThreads {
  kernels::cpu::ThreadPool pool{1};
  kernels::cpu::Ctx ctx{2, &pool};
};

// The two cases of an op's emulated check, check(kemu::Stream): on the calling thread (null stream),
// and with its blocks spread over two OS threads (suite threads: a separate meson test, also under
// TSan; the results may not depend on which thread ran which block).
#define D2L_EMULATED_CASES(name, threads_name, check)                                  \
  TEST_CASE(name) { check(nullptr); }                                                  \
  TEST_CASE(threads_name * doctest::test_suite("threads")) {                           \
    ::d2l::test::TwoThreads two;                                                       \
    check(&two.ctx);                                                                   \
  }

// Element counts for the elementwise kernels: one element, one partial block, several blocks, and
// more than the grid (its grid-stride tails).
inline constexpr int64_t kGridSizes[] = {1, 7, 1000, 4099};

// Lists of tensors for the multi-tensor kernels (sgd's and adam's, kernels/cuda/multi_tensor.cuh):
//   kListSizes    sizes of one element, a few, an empty tensor, one chunk (4096) and one more
//   many_sizes()  more tensors than one launch's table holds (kMaxTensorsPerLaunch): two full tables and
//                 part of a third, of 0 to 8 elements
// lists_of(sizes, seed): one vector of values per size; pointers(v): their data, as the launchers take it.
inline const std::vector<int64_t> kListSizes = {1, 3, 0, 1000, 4097};
inline std::vector<int64_t> many_sizes() {
  std::vector<int64_t> sizes;
  for (int64_t t = 0; t < 2 * kemu::kMaxTensorsPerLaunch + 5; ++t) sizes.push_back(t % 9);
  return sizes;
}
inline std::vector<std::vector<float>> lists_of(const std::vector<int64_t>& sizes, uint32_t seed) {
  std::vector<std::vector<float>> out;
  for (int64_t n : sizes) out.push_back(lcg_data(n, seed++));
  return out;
}
inline std::vector<float*> pointers(std::vector<std::vector<float>>& v) {
  std::vector<float*> out;
  for (auto& x : v) out.push_back(x.data());
  return out;
}

// Row shapes (N, K) for the kernels that reduce rows (argmax, softmax_ce): classes fewer than,
// equal to and more than a warp's 32 lanes.
struct RowsShape {
  int64_t N, K;
};
inline const RowsShape kRowShapes[] = {{1, 1}, {7, 10}, {1000, 10}, {5, 32}, {3, 33}, {2, 4099}, {4099, 3}};

// Calls check(n) for each of kGridSizes, check(r) for each of kRowShapes: a failure names the size.
template <class Check>
void for_grid_sizes(Check check) {
  for (int64_t n : kGridSizes) {
    CAPTURE(n);
    check(n);
  }
}
template <class Check>
void for_row_shapes(Check check) {
  for (const RowsShape& r : kRowShapes) {
    CAPTURE(r.N);
    CAPTURE(r.K);
    check(r);
  }
}

// Calls check(sizes) with kListSizes, then with many_sizes(): a failure names the list's length.
template <class Check>
void for_list_sizes(Check check) {
  for (const auto& sizes : {kListSizes, many_sizes()}) {
    CAPTURE(sizes.size());
    check(sizes);
  }
}

// Bitwise equality (same algorithm, same operation order): prints the first few differences.
template <class T>
bool same_bits(const std::vector<T>& ref, const std::vector<T>& got, const char* what) {
  if (ref.size() != got.size()) {
    std::printf("  %s: size %zu vs %zu\n", what, ref.size(), got.size());
    return false;
  }
  int bad = 0;
  for (size_t i = 0; i < ref.size(); ++i)
    if (std::memcmp(&ref[i], &got[i], sizeof(T)) != 0 && bad++ < 5)
      std::printf("  %s: differs at %zu: ref %.9g got %.9g\n", what, i, double(ref[i]), double(got[i]));
  if (bad) std::printf("  %s: %d of %zu differ\n", what, bad, ref.size());
  return bad == 0;
}

// How often the emulated kernels whose name starts with `prefix` have been launched since the start (a
// template kernel is logged with its arguments: "winograd_input_kernel<winograd::F4>"). Tests take the
// difference around what they run.
inline int64_t launches(const std::string& prefix) {
  int64_t count = 0;
  for (const auto& [kernel, n] : d2l::cuda_emu::launch_log())
    if (kernel.rfind(prefix, 0) == 0) count += n;
  return count;
}

// Finite differences of the emulated forward. Accepted when |numeric - analytic| <= atol + rtol *
// |numeric| at every sampled point (at most 200). The same gradient scaled by 1.05 (a deliberately
// broken backward) must then be rejected at some point, unless the gradient is all but zero.
struct FdTol {
  double h;            // step
  double atol = 1e-3;  // float forward: rounding noise of the loss divided by 2h
  double rtol = 1e-2;
};
inline constexpr int64_t kFdPoints = 200;

inline int count_outside(const FdSample& fd, const std::vector<float>& grad, double atol,
                         double rtol) {
  int bad = 0;
  for (size_t k = 0; k < fd.idx.size(); ++k) {
    const double a = grad[static_cast<size_t>(fd.idx[k])], nu = fd.numeric[k];
    bad += !(std::fabs(nu - a) <= atol + rtol * std::fabs(nu));
  }
  return bad;
}

inline bool grad_check(const std::vector<float>& x, const std::vector<float>& grad, const LossFn& loss,
                       FdTol tol, const char* what, bool broken_must_fail = true,
                       const std::function<bool(int64_t)>& skip = {}) {
  const auto fd = fd_gradient(x, loss, tol.h, kFdPoints, skip);
  bool ok = fd_agrees(fd, grad, tol.atol, tol.rtol, what);
  if (broken_must_fail) {
    std::vector<float> broken = grad;
    for (float& g : broken) g *= 1.05f;
    const int caught = count_outside(fd, broken, tol.atol, tol.rtol);
    if (caught == 0) std::printf("  %s: the gradient scaled by 1.05 passed the check\n", what);
    ok = ok && caught > 0;
  }
  return ok;
}

inline std::vector<float> to_float(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// An elementwise activation's kernels, emulated and on the CPU: forward(x -> y, n) and backward(saved,
// dy -> dx, n), whose `saved` is the forward's input (relu) or its output (sigmoid).
struct Activation {
  const char* name;
  void (*emu_forward)(kemu::Stream, const float*, float*, int64_t);
  void (*emu_backward)(kemu::Stream, const float*, const float*, float*, int64_t);
  void (*cpu_forward)(const kernels::cpu::Ctx&, const float*, float*, int64_t);
  void (*cpu_backward)(const kernels::cpu::Ctx&, const float*, const float*, float*, int64_t);
  bool backward_reads_output;
};

// The emulated kernels bitwise the CPU's on x = x_of(n) for each n of kGridSizes (dy = lcg_data(n, 4)):
// the forward, then the backward from what it reads (x, or the CPU forward's y); n = 0 launches nothing.
template <class Data>
void check_activation_emulated(kemu::Stream s, const Activation& a, const Data& x_of) {
  const std::string name = a.name;
  for_grid_sizes([&](int64_t n) {
    const std::vector<float> x = x_of(n), dy = lcg_data(n, 4);
    std::vector<float> got(n), ref(n);
    a.emu_forward(s, x.data(), got.data(), n);
    a.cpu_forward(kernels::cpu::serial_ctx(), x.data(), ref.data(), n);
    CHECK(same_bits(ref, got, (name + "_forward").c_str()));
    const std::vector<float> saved = a.backward_reads_output ? ref : x;
    a.emu_backward(s, saved.data(), dy.data(), got.data(), n);
    a.cpu_backward(kernels::cpu::serial_ctx(), saved.data(), dy.data(), ref.data(), n);
    CHECK(same_bits(ref, got, (name + "_backward").c_str()));
  });
  float v = 1.0f;  // n = 0 launches nothing
  a.emu_forward(s, &v, &v, 0);
  CHECK(v == 1.0f);
}

// The emulated backward at x against finite differences of the emulated forward, of the loss
// sum(r * y(x)): FdTol's tolerances with step 1e-2, and the gradient scaled by 1.05 must fail.
inline bool activation_fd_ok(const Activation& a, const std::vector<float>& x, const std::vector<float>& r) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<float> y(n), dx(n);
  a.emu_forward(nullptr, x.data(), y.data(), n);
  a.emu_backward(nullptr, a.backward_reads_output ? y.data() : x.data(), r.data(), dx.data(), n);
  auto loss = [&](const std::vector<double>& xd) {
    const auto xf = to_float(xd);
    std::vector<float> yf(xf.size());
    a.emu_forward(nullptr, xf.data(), yf.data(), n);
    return dot(to_double(yf), r);
  };
  return grad_check(x, dx, loss, {1e-2}, (std::string(a.name) + " dx").c_str());
}

// Labels in [0, K) from a simple hash, independent of the library's RNG.
inline std::vector<int32_t> labels_for(int64_t N, int64_t K, uint32_t seed) {
  std::vector<int32_t> y(static_cast<size_t>(N));
  uint32_t s = seed * 2654435761u + 7u;
  for (auto& v : y) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(K));
  }
  return y;
}

}  // namespace d2l::test
