// One tolerance helper for every numeric test: |ref - x| <= atol + rtol * |ref|.
// On failure prints the worst index and the first few mismatches.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace d2l::test {

// The Python the PyTorch-side tests run: D2L_PYTHON, else Debian's /usr/bin/python3 (the one
// python3-torch installs into).
inline std::string python() {
  const char* env = std::getenv("D2L_PYTHON");
  return env ? env : "/usr/bin/python3";
}
// Whether python() can import these modules ("torch" or "torch, torchvision"). A test case that
// needs them is declared `* doctest::skip(!python_can_import("torch"))`: reported as skipped where
// they are missing, never as passed.
inline bool python_can_import(const std::string& modules) {
  const std::string cmd = "'" + python() + "' -c 'import " + modules + "' >/dev/null 2>&1";
  return std::system(cmd.c_str()) == 0;
}
// A file beside a test's source, `source` being the test's __FILE__ as the compiler saw it: the path as
// is where it is absolute or found from the working directory, else from the build directory, whose
// copy of the source's folder (tests/, chapters/<name>/) holds this executable.
inline std::string beside_source(const char* source, const char* name) {
  namespace fs = std::filesystem;
  const fs::path folder = fs::path(source).parent_path(), here = folder / name;
  if (here.is_absolute() || fs::exists(here)) return here.string();
  std::error_code ec;
  fs::path build_root = fs::read_symlink("/proc/self/exe", ec).parent_path();
  for (const fs::path& part : folder)
    if (part != ".." && part != ".") build_root = build_root.parent_path();
  return (build_root / here).lexically_normal().string();
}

template <class Ref, class Got>
bool close(const Ref* ref, const Got* got, int64_t n, double atol, double rtol, const char* what = "") {
  int64_t bad = 0, worst = -1;
  double worst_excess = 0;
  for (int64_t i = 0; i < n; ++i) {
    double r = static_cast<double>(ref[i]), x = static_cast<double>(got[i]);
    double tol = atol + rtol * std::fabs(r);
    double err = std::fabs(r - x);
    if (!(err <= tol)) {  // NaN fails too
      if (bad < 10) std::printf("  %s mismatch at %lld: ref %.9g got %.9g\n", what, (long long)i, r, x);
      ++bad;
      double excess = std::isnan(err) ? INFINITY : err - tol;
      if (worst < 0 || excess > worst_excess) worst = i, worst_excess = excess;
    }
  }
  if (bad) std::printf("  %s: %lld of %lld outside atol %g rtol %g; worst at %lld\n", what, (long long)bad,
                       (long long)n, atol, rtol, (long long)worst);
  return bad == 0;
}

template <class Ref, class Got>
bool close(const std::vector<Ref>& ref, const std::vector<Got>& got, double atol, double rtol,
           const char* what = "") {
  if (ref.size() != got.size()) {
    std::printf("  %s: size %zu vs %zu\n", what, ref.size(), got.size());
    return false;
  }
  return close(ref.data(), got.data(), static_cast<int64_t>(ref.size()), atol, rtol, what);
}

// Deterministic test data independent of the library's RNG: a small LCG in [-1, 1).
inline std::vector<float> lcg_data(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 12345u;
  for (auto& x : v) {
    s = s * 1664525u + 1013904223u;
    x = static_cast<float>((s >> 8) * (1.0 / 16777216.0) * 2.0 - 1.0);
  }
  return v;
}

// Central finite differences of a scalar L(x) evaluated in double, for kernel-level gradient checks:
// x[i] is moved by +-h in float and the difference is divided by the distance actually stored
// (float(x+h) - float(x-h)).
inline std::vector<double> numeric_grad(std::vector<float> x, const std::function<double(const std::vector<float>&)>& L,
                                        float h = 1e-3f) {
  std::vector<double> g(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const float x0 = x[i];
    x[i] = x0 + h;
    const double lp = L(x), xp = x[i];
    x[i] = x0 - h;
    const double lm = L(x), xm = x[i];
    x[i] = x0;
    g[i] = (lp - lm) / (xp - xm);
  }
  return g;
}


// The reference GEMM of every GEMM test, in double: C = alpha * op(A) op(B) + beta * C0, with A
// stored (K, M) when ta else (M, K), B stored (N, K) when tb else (K, N); beta 0 does not read C0
// (as BLAS), so C0 may hold NaN.
inline std::vector<double> ref_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                                    const std::vector<float>& A, const std::vector<float>& B, double beta,
                                    const std::vector<float>& C0) {
  std::vector<double> C(static_cast<size_t>(M * N));
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j) {
      double acc = 0.0;
      for (int64_t k = 0; k < K; ++k)
        acc += double(ta ? A[k * M + i] : A[i * K + k]) * double(tb ? B[j * K + k] : B[k * N + j]);
      C[i * N + j] = alpha * acc + (beta == 0.0 ? 0.0 : beta * C0[i * N + j]);
    }
  return C;
}

}  // namespace d2l::test
