#include "core/comm.hpp"

#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {

static void check(const char* op, const std::vector<Tensor>& data) {
  for (auto& t : data) {
    if (t.shape() != data[0].shape() || t.dtype() != DType::f32)
      throw ShapeError(std::string(op) + ": every device's tensor must be float32 " + str(data[0].shape()));
    for (auto& u : data)
      if (&u != &t && u.device() == t.device()) throw ShapeError(std::string(op) + ": two tensors on " + t.device().str());
  }
}

void allreduce_naive(const std::vector<Tensor>& data) {
  check("allreduce", data);
  NoGrad no_grad;
  for (size_t i = 1; i < data.size(); ++i) add_(data[0], data[i].to(data[0].device()));
  for (size_t i = 1; i < data.size(); ++i) data[0].copyto(data[i]);
}

void allreduce_ring(const std::vector<Tensor>& data) {
  check("allreduce_ring", data);
  const int64_t n = static_cast<int64_t>(data.size()), N = data[0].numel();
  if (n < 2) return;
  auto begin = [&](int64_t c) { return N * c / n; };  // chunk c is [begin(c), begin(c+1)): sizes differ by <= 1
  // One receive buffer per device, as large as the largest chunk.
  std::vector<Tensor> recv;
  for (auto& t : data) recv.push_back(Tensor::empty({N / n + 1}, t.device()));
  // Reduce-scatter: at step s device i sends chunk (i - s) mod n to device i+1, which adds it to its own.
  for (int64_t s = 0; s < n - 1; ++s) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t c = ((i - s) % n + n) % n, j = (i + 1) % n;
      int64_t off = begin(c), len = begin(c + 1) - off;
      copy_bytes(data[i], off * 4, recv[j], 0, len * 4);
      float* dst = data[j].data() + off;
      const float* src = recv[j].data();
      launch(data[j].device(), "allreduce_ring_add", detail::keep({data[j], recv[j]}),
             [=](const LaunchCtx& ctx) { D2L_KERNEL(ctx, axpy, 1.0f, src, dst, len); });
    }
  }
  // Device i now holds the full sum of chunk (i + 1) mod n. All-gather: pass finished chunks on.
  for (int64_t s = 0; s < n - 1; ++s) {
    for (int64_t i = 0; i < n; ++i) {
      int64_t c = ((i + 1 - s) % n + n) % n, j = (i + 1) % n;
      int64_t off = begin(c), len = begin(c + 1) - off;
      copy_bytes(data[i], off * 4, data[j], off * 4, len * 4);
    }
  }
}

void allreduce(const std::vector<Tensor>& data, const std::string& algorithm) {
  if (algorithm == "naive") allreduce_naive(data);
  else if (algorithm == "ring") allreduce_ring(data);
  else throw ConfigError("bad --allreduce '" + algorithm + "': expected naive or ring");
}

}  // namespace d2l
