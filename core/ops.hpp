// Differentiable ops on tensors: shape checks on the host, kernels enqueued on the device's compute
// stream (kernels/cpu today; kernels/cuda for gpu and emu), a graph node when recording.
// Every op checks that its inputs live on one device: copies between devices are explicit (to()).
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

// ---- linear algebra
// a (M, K) @ b (K, N) -> (M, N); trans_a / trans_b use a^T (a stored (K, M)) and b^T (b stored (N, K)).
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x (N, C, ...) + b (C): the bias broadcast along axis 1 (dense: (N, F) + (F); conv: (N, C, H, W) + (C)).
Tensor bias_add(const Tensor& x, const Tensor& b);
// Gluon's Dense: x (N, in) @ w^T with w (out, in), plus b (out).
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- elementwise
Tensor relu(const Tensor& x);
Tensor add(const Tensor& a, const Tensor& b);  // same shapes
Tensor mul(const Tensor& a, const Tensor& b);  // same shapes
Tensor scale(const Tensor& x, float alpha);    // alpha * x
Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& x, float alpha);

// ---- reductions and losses (results are one-element tensors of shape (1) unless noted)
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);
enum class Reduction { none, sum, mean };
// logits (N, K), labels (N) int32 -> per-sample losses (N), or their sum / mean.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction r = Reduction::mean);
// d2l's squared loss (p - t)^2 / 2 per element, or its sum / mean.
Tensor mse_loss(const Tensor& p, const Tensor& t, Reduction r = Reduction::mean);
Tensor argmax(const Tensor& x);                                 // (N, K) -> (N) int32
Tensor count_correct(const Tensor& logits, const Tensor& labels);  // (1): #{argmax == label}

// ---- shapes (reshape shares storage)
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed
Tensor flatten(const Tensor& x);                      // (N, ...) -> (N, rest)
Tensor concat(const std::vector<Tensor>& xs);         // along axis 0, all on one device
Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end);  // rows [begin, end) along axis 0, a copy
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes);  // along axis 0

// ---- in place, never recorded (updates and initialisation)
void fill_(const Tensor& x, float value);
void add_(const Tensor& y, const Tensor& x, float alpha = 1.0f);  // y += alpha * x
void scale_(const Tensor& x, float alpha);
void sgd_update_(const Tensor& w, const Tensor& g, float lr);     // w -= lr * g

// ---- random (core/rng.hpp has the seed): counter-based, the same values on every device
Tensor normal(const Shape& shape, float mean, float stddev, Device d);
Tensor uniform(const Shape& shape, float lo, float hi, Device d);

}  // namespace d2l
