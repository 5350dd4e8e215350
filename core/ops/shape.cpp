// reshape, flatten, concat / slice_rows / split along the batch axis.

#include <cstring>

#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;

Tensor reshape(const Tensor& x, const Shape& shape) {
  Shape s = shape;
  int64_t known = 1, infer = -1;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == -1) {
      if (infer >= 0) fail("reshape", "only one -1 allowed in " + str(shape));
      infer = static_cast<int64_t>(i);
    } else if (s[i] < 0) {
      fail("reshape", "bad target shape " + str(shape));
    } else {
      known *= s[i];
    }
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known) fail("reshape", "cannot infer -1 reshaping " + str(x.shape()) + " to " + str(shape));
    s[infer] = x.numel() / known;
  }
  if (numel(s) != x.numel()) fail("reshape", "cannot reshape " + str(x.shape()) + " to " + str(shape));
  auto p = std::make_shared<TensorImpl>();
  p->shape = s;
  p->dtype = x.dtype();
  p->device = x.device();
  p->storage = x.storage();  // a view: same memory
  Tensor y(p);
  Shape from = x.shape();
  record(y, "reshape", {x}, [from](const Tensor& gy) { return std::vector<Tensor>{reshape(gy, from)}; });
  return y;
}

Tensor flatten(const Tensor& x) {
  if (x.ndim() < 1) fail("flatten", "needs at least one dimension");
  int64_t rest = 1;
  for (int64_t i = 1; i < x.ndim(); ++i) rest *= x.shape()[i];
  return reshape(x, {x.dim(0), rest});
}

// Copies `rows` rows of `src` starting at src_row into dst starting at dst_row (same row size).
// Rows of 16-bit elements (autocast's activations on CPU devices) are copied in host memory: CPU and
// emulated devices only.
static void copy_rows(const Tensor& src, int64_t src_row, const Tensor& dst, int64_t dst_row, int64_t rows) {
  const int64_t size = static_cast<int64_t>(dtype_size(src.dtype()));
  if (size != 4 && dst.device().kind == DeviceKind::gpu)
    fail("concat and slice_rows", std::string("rows of ") + dtype_name(src.dtype()) + " are copied on CPU and emulated "
                                  "devices only; cast to float32 first");
  int64_t row_bytes = (src.dim(0) ? src.numel() / src.dim(0) : 0) * size;
  if (rows == 0 || row_bytes == 0) return;
  const char* from = static_cast<const char*>(src.storage()->ptr) + src_row * row_bytes;
  char* to = static_cast<char*>(dst.storage()->ptr) + dst_row * row_bytes;
  size_t bytes = static_cast<size_t>(rows * row_bytes);
  if (size != 4) {
    launch(dst.device(), "copy_rows", keep({src, dst}), [=](const LaunchCtx&) { std::memcpy(to, from, bytes); });
    return;
  }
  // Rows hold 4-byte elements (float32 or int32): the backend's copy kernel moves them as floats.
  const float* f = reinterpret_cast<const float*>(from);
  float* t = reinterpret_cast<float*>(to);
  int64_t n = static_cast<int64_t>(bytes / 4);
  launch(dst.device(), "copy_rows", keep({src, dst}), [=](const LaunchCtx& c) { D2L_KERNEL(c, copy, f, t, n); });
}

static Shape with_rows(const Shape& s, int64_t rows) {
  Shape out = s;
  out[0] = rows;
  return out;
}

Tensor concat(const std::vector<Tensor>& xs) {
  if (xs.empty()) fail("concat", "needs at least one tensor");
  Device d = same_device("concat", xs);
  int64_t rows = 0;
  for (auto& x : xs) {
    if (x.ndim() < 1 || x.dtype() != xs[0].dtype() ||
        Shape(x.shape().begin() + 1, x.shape().end()) != Shape(xs[0].shape().begin() + 1, xs[0].shape().end()))
      fail("concat", "shapes " + str(xs[0].shape()) + " and " + str(x.shape()) + " differ beyond axis 0");
    rows += x.dim(0);
  }
  Tensor y = Tensor::empty(with_rows(xs[0].shape(), rows), d, xs[0].dtype());
  int64_t at = 0;
  std::vector<int64_t> sizes;
  for (auto& x : xs) {
    copy_rows(x, 0, y, at, x.dim(0));
    at += x.dim(0);
    sizes.push_back(x.dim(0));
  }
  if (y.dtype() == DType::f32)
    record(y, "concat", xs, [sizes](const Tensor& gy) { return split(gy, sizes); });
  return y;
}

Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end) {
  if (x.ndim() < 1 || begin < 0 || end < begin || end > x.dim(0))
    fail("slice_rows", "rows [" + std::to_string(begin) + ", " + std::to_string(end) + ") outside " + str(x.shape()));
  Tensor y = Tensor::empty(with_rows(x.shape(), end - begin), x.device(), x.dtype());
  copy_rows(x, begin, y, 0, end - begin);
  if (x.dtype() == DType::f32) {
    Shape shape = x.shape();
    record(y, "slice_rows", {x}, [shape, begin](const Tensor& gy) {
      Tensor gx = Tensor::zeros(shape, gy.device());
      copy_rows(gy, 0, gx, begin, gy.dim(0));
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes) {
  int64_t total = 0;
  for (auto s : sizes) {
    if (s < 0) fail("split", "negative size");
    total += s;
  }
  if (x.ndim() < 1 || total != x.dim(0))
    fail("split", "sizes add up to " + std::to_string(total) + " but x has shape " + str(x.shape()));
  std::vector<Tensor> out;
  int64_t at = 0;
  for (auto s : sizes) {
    out.push_back(slice_rows(x, at, at + s));
    at += s;
  }
  return out;
}

}  // namespace d2l
