#include "core/comm.hpp"

#include <algorithm>

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

int64_t chunk_begin(int64_t n, int64_t chunk, int64_t chunks) { return n * chunk / chunks; }

void allreduce_ring(const std::vector<Tensor>& data) {
  check("allreduce_ring", data);
  const int64_t n = static_cast<int64_t>(data.size()), N = data[0].numel();
  if (n < 2) return;
  auto begin = [&](int64_t c) { return chunk_begin(N, c, n); };  // chunk c is [begin(c), begin(c+1))
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

namespace {

int64_t elements(const std::vector<Tensor>& pieces) {
  int64_t n = 0;
  for (auto& t : pieces) n += t.numel();
  return n;
}

void check_reduce_scatter(const std::vector<std::vector<Tensor>>& data, const std::vector<int64_t>& bounds,
                          const std::vector<Tensor>& out) {
  const size_t n = data.size();
  const int64_t total = n == 0 ? 0 : elements(data[0]);
  bool ok = n > 0 && out.size() == n && bounds.size() == n + 1 && bounds[0] == 0 && bounds[n] == total;
  for (size_t i = 0; ok && i < n; ++i) ok = bounds[i] <= bounds[i + 1];
  if (!ok)
    throw ShapeError("reduce_scatter: " + std::to_string(n) + " devices need " + std::to_string(n) + " outputs and " +
                     std::to_string(n + 1) + " shard bounds from 0 to " + std::to_string(total) + ", never decreasing");
  for (size_t i = 0; i < n; ++i) {
    const Device d = out[i].device();
    if (elements(data[i]) != total)
      throw ShapeError("reduce_scatter: device " + d.str() + " holds " + std::to_string(elements(data[i])) +
                       " elements, device " + out[0].device().str() + " " + std::to_string(total));
    for (auto& t : data[i])
      if (t.dtype() != DType::f32 || t.device() != d)
        throw ShapeError("reduce_scatter: every piece of device " + std::to_string(i) + "'s data must be float32 on " + d.str());
    if (out[i].dtype() != DType::f32 || out[i].numel() != bounds[i + 1] - bounds[i])
      throw ShapeError("reduce_scatter: the output on " + d.str() + " must be float32 of shard " + std::to_string(i) +
                       "'s " + std::to_string(bounds[i + 1] - bounds[i]) + " elements");
    for (size_t j = 0; j < i; ++j)
      if (out[j].device() == d) throw ShapeError("reduce_scatter: two devices' data on " + d.str());
  }
}

// Elements [lo, hi) of the vector the pieces form, end to end, copied into dst from its start.
void copy_range(const std::vector<Tensor>& pieces, int64_t lo, int64_t hi, const Tensor& dst) {
  int64_t begin = 0;  // the first element of the piece at hand
  for (auto& t : pieces) {
    const int64_t a = std::max(lo, begin), b = std::min(hi, begin + t.numel());
    if (a < b) copy_bytes(t, static_cast<size_t>(a - begin) * 4, dst, static_cast<size_t>(a - lo) * 4, static_cast<size_t>(b - a) * 4);
    begin += t.numel();
  }
}

}  // namespace

void reduce_scatter(const std::vector<std::vector<Tensor>>& data, const std::vector<int64_t>& bounds,
                    const std::vector<Tensor>& out) {
  check_reduce_scatter(data, bounds, out);
  NoGrad no_grad;
  const size_t n = data.size();
  // Device i: its shard of device 0's vector into out[i], then each other device's added in turn
  // through one receive buffer. Each device's work is queued without waiting: all run together.
  for (size_t i = 0; i < n; ++i) {
    const int64_t lo = bounds[i], hi = bounds[i + 1];
    if (lo == hi) continue;
    copy_range(data[0], lo, hi, out[i]);
    const Tensor recv = n > 1 ? Tensor::empty({hi - lo}, out[i].device()) : Tensor();
    for (size_t j = 1; j < n; ++j) {
      copy_range(data[j], lo, hi, recv);
      add_(out[i], recv);
    }
  }
}

std::vector<Tensor> reduce_scatter(const std::vector<Tensor>& data, const std::vector<int64_t>& bounds) {
  std::vector<std::vector<Tensor>> pieces;
  std::vector<Tensor> out;
  for (size_t i = 0; i < data.size(); ++i) {
    pieces.push_back({data[i]});
    const int64_t size = i + 1 < bounds.size() ? bounds[i + 1] - bounds[i] : 0;
    out.push_back(Tensor::empty({std::max<int64_t>(size, 0)}, data[i].device()));
  }
  reduce_scatter(pieces, bounds, out);
  return out;
}

void allreduce(const std::vector<Tensor>& data, const std::string& algorithm) {
  if (algorithm == "naive") allreduce_naive(data);
  else if (algorithm == "ring") allreduce_ring(data);
  else throw ConfigError("bad --allreduce '" + algorithm + "': expected naive or ring");
}

}  // namespace d2l
