// cast: a tensor's values in another floating-point type (kernels/{cpu,cuda}/cast); its backward
// casts the gradient back.
#include "core/ops.hpp"
#include "core/ops/op.hpp"

// The kernels, on every backend (kernels/cpu/cast.cpp, kernels/cuda/cast.cu), over flat arrays of n:
// float32 rounded to nearest even into bfloat16 or float16 bits, and those bits widened (exactly).
D2L_DECLARE_KERNEL(cast_to_bf16, const float* x, uint16_t* y, int64_t n);
D2L_DECLARE_KERNEL(cast_to_f16, const float* x, uint16_t* y, int64_t n);
D2L_DECLARE_KERNEL(cast_from_bf16, const uint16_t* x, float* y, int64_t n);
D2L_DECLARE_KERNEL(cast_from_f16, const uint16_t* x, float* y, int64_t n);

namespace d2l {
using namespace detail;

// One kernel: into or out of float32.
static Tensor cast_once(const Tensor& x, DType t) {
  Tensor y = Tensor::empty(x.shape(), x.device(), t);
  const int64_t n = x.numel();
  if (x.dtype() == DType::f32) {
    const bool bf16 = t == DType::bf16;
    run("cast", {x, y}, [=, X = x.data(), Y = y.data16()](const LaunchCtx& c) {
      if (bf16) D2L_KERNEL(c, cast_to_bf16, X, Y, n);
      else D2L_KERNEL(c, cast_to_f16, X, Y, n);
    });
  } else {
    const bool bf16 = x.dtype() == DType::bf16;
    run("cast", {x, y}, [=, X = x.data16(), Y = y.data()](const LaunchCtx& c) {
      if (bf16) D2L_KERNEL(c, cast_from_bf16, X, Y, n);
      else D2L_KERNEL(c, cast_from_f16, X, Y, n);
    });
  }
  return y;
}

Tensor cast(const Tensor& x, DType t) {
  same_device("cast", {x});
  if (!is_float(x.dtype()) || !is_float(t))
    fail("cast", std::string("casts between float32, bfloat16 and float16, not ") + dtype_name(x.dtype()) + " to " +
                     dtype_name(t));
  if (x.dtype() == t) return x;
  Tensor y = x.dtype() == DType::f32 || t == DType::f32 ? cast_once(x, t) : cast_once(cast_once(x, DType::f32), t);
  const DType from = x.dtype();
  record(y, "cast", {x}, [from](const Tensor& gy) { return std::vector<Tensor>{cast(gy, from)}; });
  if (y.impl().grad_fn) y.impl().grad_fn->keeps_nothing = true;  // autocast's weight copies are read again
  return y;
}

}  // namespace d2l
