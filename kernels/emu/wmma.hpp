// Tensor cores under the emulation: CUDA's warp matrix API (nvcuda::wmma, <mma.h>) for TF32, the
// shape m16n16k8, as g++ compiles the kernels of kernels/cuda. Kernels write `wmma::...` in both
// builds: under nvcc d2l_cuda.cuh makes `wmma` nvcuda::wmma, here it is this namespace.
//
// On a GPU a fragment is spread over the 32 lanes of a warp (each lane holds a few elements, in an
// order CUDA leaves unspecified), and load/mma/store are warp-wide instructions. Here every lane
// holds the whole tile in logical row-major order and does the whole operation itself: 32 times the
// work, the same result. A kernel may only use what CUDA guarantees: element-wise loops over
// frag.x[0 .. num_elements) (converting each to TF32, scaling), never which element a lane holds.
//
// TF32 (sm_80 and later): 1 sign, 8 exponent and 10 mantissa bits, an FP32 with its 13 low bits zero.
// __float_to_tf32 rounds to nearest, ties away from zero (PTX cvt.rna.tf32.f32). The tensor core
// itself ignores the 13 low bits of an unconverted input, so mma_sync here truncates its inputs:
// a kernel that forgets the conversion is as wrong here as on the GPU. Products are summed in FP32,
// in k order.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace d2l::cuda_emu::wmma {

struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
namespace precision {
struct tf32 {};
}  // namespace precision
enum layout_t { mem_row_major, mem_col_major };

namespace detail {
template <class Use, int M, int N, int K>
struct Dims;
template <int M, int N, int K>
struct Dims<matrix_a, M, N, K> {
  static constexpr int rows = M, cols = K;
};
template <int M, int N, int K>
struct Dims<matrix_b, M, N, K> {
  static constexpr int rows = K, cols = N;
};
template <int M, int N, int K>
struct Dims<accumulator, M, N, K> {
  static constexpr int rows = M, cols = N;
};
inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// What the tensor core reads of an FP32 input: its 19 high bits.
inline float tf32_truncate(float f) { return std::isfinite(f) ? float_of(bits_of(f) & 0xffffe000u) : f; }
}  // namespace detail

// Round to the nearest TF32, ties away from zero; NaN and infinities pass unchanged.
inline float __float_to_tf32(float f) {
  if (!std::isfinite(f)) return f;
  return detail::float_of((detail::bits_of(f) + 0x1000u) & 0xffffe000u);
}

// fragment<matrix_a, 16, 16, 8, precision::tf32, row_major>: a 16 x 8 tile of A;
// fragment<matrix_b, 16, 16, 8, precision::tf32, row_major>: an 8 x 16 tile of B;
// fragment<accumulator, 16, 16, 8, float>: the 16 x 16 tile of C. Element (r, c) is x[r * cols + c].
template <class Use, int M, int N, int K, class T, class Layout = void>
struct fragment {
  static_assert(M == 16 && N == 16 && K == 8, "the emulation has TF32's one shape, m16n16k8");
  using D = detail::Dims<Use, M, N, K>;
  static constexpr int rows = D::rows, cols = D::cols;
  static constexpr int num_elements = rows * cols;
  float x[num_elements];
};

template <class Use, int M, int N, int K, class T, class L>
inline void fill_fragment(fragment<Use, M, N, K, T, L>& f, float v) {
  for (float& e : f.x) e = v;
}

// A or B from memory; ldm is the stride (in elements) between rows (row_major) or columns
// (col_major) of the stored tile.
template <class Use, int M, int N, int K, class T, class L>
inline void load_matrix_sync(fragment<Use, M, N, K, T, L>& f, const float* p, unsigned ldm) {
  using F = fragment<Use, M, N, K, T, L>;
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c)
      f.x[r * F::cols + c] = std::is_same_v<L, col_major> ? p[r + size_t(c) * ldm] : p[size_t(r) * ldm + c];
}
// The accumulator from memory, its layout named at the call.
template <int M, int N, int K>
inline void load_matrix_sync(fragment<accumulator, M, N, K, float>& f, const float* p, unsigned ldm, layout_t layout) {
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      f.x[r * N + c] = layout == mem_col_major ? p[r + size_t(c) * ldm] : p[size_t(r) * ldm + c];
}
template <int M, int N, int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, M, N, K, float>& f, unsigned ldm, layout_t layout) {
  for (int r = 0; r < M; ++r)
    for (int c = 0; c < N; ++c)
      (layout == mem_col_major ? p[r + size_t(c) * ldm] : p[size_t(r) * ldm + c]) = f.x[r * N + c];
}

// d = a @ b + c (d may be c).
template <int M, int N, int K, class LA, class LB>
inline void mma_sync(fragment<accumulator, M, N, K, float>& d, const fragment<matrix_a, M, N, K, precision::tf32, LA>& a,
                     const fragment<matrix_b, M, N, K, precision::tf32, LB>& b,
                     const fragment<accumulator, M, N, K, float>& c) {
  float out[M * N];
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = c.x[i * N + j];
      for (int k = 0; k < K; ++k) s += detail::tf32_truncate(a.x[i * K + k]) * detail::tf32_truncate(b.x[k * N + j]);
      out[i * N + j] = s;
    }
  std::memcpy(d.x, out, sizeof out);
}

}  // namespace d2l::cuda_emu::wmma
