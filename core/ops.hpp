// Differentiable ops on tensors: shape checks on the host, kernels enqueued on the device's compute
// stream (kernels/cpu today; kernels/cuda for gpu and emu), a graph node when recording.
// Every op checks that its inputs live on one device: copies between devices are explicit (to()).
// One op = one name: conv2d is core/ops/conv2d.cpp, kernels/cpu/conv2d.cpp, kernels/cuda/conv2d.cu
// and tests/test_conv2d.cpp; the shared steps are core/ops/op.hpp. This header is the one list of ops
// (the build reads its `// ---- op` markers, below).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/tensor.hpp"

namespace d2l {

// Each op with its own kernels opens its section with a marker line, `// ---- op <name>: <meaning>`:
// <name> is the op's name in every folder (kernels/cpu/<name>.cpp, kernels/cuda/<name>.cu,
// core/ops/<name>.cpp, tests/test_<name>.cpp), and the top-level meson.build builds exactly the
// names these markers give. Sections without the marker (`// ---- shapes`) are ops built from others
// or from shared kernels.

// A loss's result: the per-sample values (none), or their sum or mean (a one-element tensor (1)).
enum class Reduction { none, sum, mean };
using Pair = std::array<int64_t, 2>;  // (height, width)

// ---- linear algebra (core/ops/matmul.cpp, the GEMMs of kernels/cpu/gemm.cpp and kernels/cuda/matmul.cu)
// a (M, K) @ b (K, N) -> (M, N); trans_a / trans_b use a^T (a stored (K, M)) and b^T (b stored (N, K)).
// a and b float32, or both bfloat16 or both float16: then the sums are float32's (the 16-bit GEMMs,
// kernels/cpu/gemm16.cpp, kernels/cuda/matmul16.cu, cuBLAS's GemmEx) and the result is rounded once
// into their type, as PyTorch's matmul of 16-bit tensors.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// Gluon's Dense: x (N, in) @ w^T with w (out, in), plus b (out).
Tensor dense(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- op cast: the values in another floating-point type (float32, bfloat16, float16), rounded to nearest even
// x.to(dtype) in PyTorch: x itself when it has that type already; narrowing rounds as
// kernels/cpu/float16.hpp says (overflow to infinity), widening is exact; between bfloat16 and float16
// through float32 (exact, then one rounding). The gradient is cast back to x's type (as PyTorch's).
Tensor cast(const Tensor& x, DType t);

// ---- autocast (core/ops/autocast.cpp): which op runs in which floating-point type (torch.autocast)
// While an Autocast scope is open on a thread, the ops that thread calls cast their float inputs by
// one list, autocast_ops(): lower_precision ops (the GEMMs: matmul, dense's product, conv2d) take them
// in the scope's 16-bit type, float32 ops (losses, reductions, SyncBatchNorm's pieces, and every op
// whose kernels are float32 only) take them in float32, and input_type ops (bias_add, relu, add,
// max_pool2d, batch_norm: PyTorch's ops outside both lists) run in the type their input has on CPU devices, where
// 16-bit kernels exist for them, so activations stay 16-bit from one convolution to the next; on GPU
// and emulated devices their kernels are float32 and they take float32. The casts are recorded, so
// gradients reach float32 leaves (the master weights) in float32. Autocast
// applies to the ops, not to in-place updates (add_, fill_, the optimizers). A parameter (a
// Parameter's replica, core/parameter.hpp) is cast once per outermost scope, its copy shared by every op and micro-batch
// that reads it until the scope closes (PyTorch's autocast cache): update parameters outside the
// scope, as PyTorch's loops do (the optimizer's step after it). Outside a scope, a 16-bit
// input reaches only matmul and conv2d (which take two of one type) and cast; the others refuse it.
class Autocast {
 public:
  explicit Autocast(DType t);  // bf16 or f16; f32 turns autocast off inside the scope
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  DType saved_;
};
DType autocast_type();  // the innermost open scope's type on this thread; f32 when none is open
enum class AutocastPolicy { lower_precision, float32, input_type };
struct AutocastRule {
  const char* op;
  AutocastPolicy policy;
  const char* why;
};
const std::vector<AutocastRule>& autocast_ops();  // every op that takes float tensors, once

// ---- op bias_add: x (N, C, ...) + b (C), the bias broadcast along axis 1
// dense: (N, F) + (F); conv: (N, C, H, W) + (C).
Tensor bias_add(const Tensor& x, const Tensor& b);

// ---- op relu: max(x, 0)
Tensor relu(const Tensor& x);

// ---- op sigmoid: 1 / (1 + exp(-x)), stable for large |x|
Tensor sigmoid(const Tensor& x);

// ---- op add: a + b and a * b elementwise (same shapes); add_ accumulates in place
Tensor add(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, const Tensor& b);
// In place, never recorded (updates, gradient accumulation): y += alpha * x.
void add_(const Tensor& y, const Tensor& x, float alpha = 1.0f);

// ---- op fill: constants and scaling, x = value and alpha * x
Tensor scale(const Tensor& x, float alpha);  // alpha * x
Tensor operator*(const Tensor& x, float alpha);
// In place, never recorded (initialisation, updates).
void fill_(const Tensor& x, float value);
void scale_(const Tensor& x, float alpha);

// ---- op sgd: w -= lr * g, in place, never recorded (the book's sgd, lr pre-divided by the batch size)
void sgd_update_(const Tensor& w, const Tensor& g, float lr);
// The Trainer's SGD (MXNet's sgd_mom_update) on lists of tensors of one device, in one kernel launch
// (multi-tensor: a table of the tensors as the launch's argument, kernels/cuda/multi_tensor.cuh): for each t,
//   mom[t] = momentum * mom[t] + decay * w[t] + grad_scale * g[t];  w[t] += mom[t]
// with the bits of scale_(mom, momentum), add_(mom, w, decay), add_(mom, g, grad_scale), add_(w, mom)
// (optim::sgd_step). Tensor t of every list has one shape. The CPU runs those kernels tensor after tensor.
void multi_sgd_mom_update_(const std::vector<Tensor>& w, const std::vector<Tensor>& mom, const std::vector<Tensor>& g,
                           float momentum, float decay, float grad_scale);

// ---- op adam: one step of PyTorch's Adam on w, m, v in place, never recorded (the Trainer's "adam")
// torch.optim.Adam, weight decay added to the gradient (not AdamW), step t = 1, 2, ...:
//   gi = grad_scale * g + wd * w
//   m  = beta1 * m + (1 - beta1) * gi                 v = beta2 * v + (1 - beta2) * gi * gi
//   w -= lr * m_hat / (sqrt(v_hat) + epsilon),         m_hat = m / (1 - beta1^t), v_hat = v / (1 - beta2^t)
// computed as PyTorch does: w -= step_size * (m / (sqrt(v) / bias_correction2_sqrt + epsilon)).
// optim::adam_constants (core/optim/kvstore.hpp) fills in step_size and bias_correction2_sqrt for lr and t.
struct AdamStep {
  float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  float wd = 0.0f;
  float grad_scale = 1.0f;             // the Trainer's 1 / batch_size
  float step_size = 0.0f;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
};
void adam_update_(const Tensor& w, const Tensor& m, const Tensor& v, const Tensor& g, const AdamStep& s);
// adam_update_ on lists of tensors of one device in one kernel launch (as multi_sgd_mom_update_): for each t
// the bits adam_update_(w[t], m[t], v[t], g[t], s) gives.
void multi_adam_update_(const std::vector<Tensor>& w, const std::vector<Tensor>& m, const std::vector<Tensor>& v,
                        const std::vector<Tensor>& g, const AdamStep& s);

// ---- op sum: the sum (and mean) of all elements, a one-element tensor (1)
Tensor sum(const Tensor& x);
Tensor mean(const Tensor& x);

// ---- op softmax_ce: softmax cross-entropy, -log softmax(logits)[label] per sample
// logits (N, K), labels (N) int32 -> per-sample losses (N), or their sum / mean.
Tensor softmax_cross_entropy(const Tensor& logits, const Tensor& labels, Reduction r = Reduction::mean);

// ---- op mse: d2l's squared loss (p - t)^2 / 2 per element, or its sum / mean
Tensor mse_loss(const Tensor& p, const Tensor& t, Reduction r = Reduction::mean);

// ---- op argmax: the index of each row's first maximum, and how many match the labels
Tensor argmax(const Tensor& x);                                    // (N, K) -> (N) int32
Tensor count_correct(const Tensor& logits, const Tensor& labels);  // (1): #{argmax == label}

// ---- shapes (reshape shares storage)
Tensor reshape(const Tensor& x, const Shape& shape);  // one -1 allowed
Tensor flatten(const Tensor& x);                      // (N, ...) -> (N, rest)
Tensor concat(const std::vector<Tensor>& xs);         // along axis 0, all on one device
Tensor slice_rows(const Tensor& x, int64_t begin, int64_t end);  // rows [begin, end) along axis 0, a copy
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes);  // along axis 0

// ---- random (core/rng.hpp has the seed): counter-based, the same values on every device
Tensor normal(const Shape& shape, float mean, float stddev, Device d);
Tensor uniform(const Shape& shape, float lo, float hi, Device d);

// ---- op conv2d: 2-D convolution (cross-correlation, as every framework computes it), NCHW
// x (N, C, H, W), w (OC, C, KH, KW), optional bias b (OC) (pass Tensor() for none) -> (N, OC, OH, OW).
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, Pair stride = {1, 1}, Pair padding = {0, 0});

// ---- op pool2d: max and average pooling over 2-D windows, NCHW
// Pooling windows never read padding as a value: max ignores it, avg divides by KH*KW (PyTorch's
// and Gluon's default count_include_pad). stride defaults to the window (the frameworks' default).
Tensor max_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor avg_pool2d(const Tensor& x, Pair kernel, Pair stride = {0, 0}, Pair padding = {0, 0});
Tensor global_avg_pool2d(const Tensor& x);  // (N, C, H, W) -> (N, C, 1, 1)

// ---- op batch_norm: normalisation over axis 1 with batch or running statistics
// Batch norm over axis 1 of x (N, C) or (N, C, H, W). In training mode (is_training()) it
// normalises with the batch statistics and updates running_mean / running_var in place:
// running = (1 - momentum) * running + momentum * batch (unbiased variance); in evaluation mode it
// uses the running statistics. gamma, beta, running_* are (C) on x's device.
Tensor batch_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, const Tensor& running_mean,
                  const Tensor& running_var, float momentum = 0.1f, float eps = 1e-5f);

// ---- synchronised batch norm (SyncBatchNorm), core/ops/batch_norm_stats.cpp: batch norm over the whole of a data-parallel batch whose
// shards live on several devices, built from three differentiable ops (kernels in
// kernels/{cpu,cuda}/batch_norm_stats) and the differentiable copies between devices:
//
//   x_j (device j) -> batch_norm_stats -> s_j (2, C) --to(d0)--+
//                                                              concat -> batch_norm_combine_stats -> g (2, C) on d0
//   x_j, g.to(device j), gamma_j, beta_j -> batch_norm_apply -> y_j
//
// d0 is the device of the first non-empty shard. The graph joins every shard: a backward from one
// device's loss reaches every shard's x through the combined statistics, so the gradients summed
// over the book's per-device backward calls (for l in ls: l.backward()) are those of batch_norm on
// the whole batch. Statistics are (2, C) tensors: row 0 the mean, row 1 the biased variance.

// One shard's statistics: x (N, C) or (N, C, H, W) with N*H*W >= 1 -> (2, C). Differentiable.
Tensor batch_norm_stats(const Tensor& x);

// K shards' statistics stacked as (2K, C) (the concat of their batch_norm_stats) and each shard's
// values per channel (N_j*H*W) -> the whole batch's (2, C). Differentiable.
Tensor batch_norm_combine_stats(const Tensor& stats, const std::vector<int64_t>& counts);

// y = gamma * (x - mean) / sqrt(var + eps) + beta with the statistics given as stats (2, C);
// gamma, beta (C). Differentiable in x, stats, gamma and beta.
Tensor batch_norm_apply(const Tensor& x, const Tensor& stats, const Tensor& gamma, const Tensor& beta,
                        float eps = 1e-5f);

// running = (1 - momentum) * running + momentum * batch statistic, the variance made unbiased with
// `count` values per channel (var * count / (count - 1)), as batch_norm does. In place, never recorded.
void batch_norm_update_running_(const Tensor& stats, int64_t count, const Tensor& running_mean,
                                const Tensor& running_var, float momentum);

// The whole: shard j is xs[j] with gamma[j], beta[j], running_mean[j], running_var[j] on its device
// (the replicas of one BatchNorm). Training mode (is_training()): every shard is normalised with the
// statistics of all shards together, and the running statistics on every device listed are updated
// with them (once per device); shards with N = 0 are allowed (an empty output) as long as the shards
// hold more than one value per channel in total. Evaluation mode: batch_norm with each device's
// running statistics, no communication.
std::vector<Tensor> sync_batch_norm(const std::vector<Tensor>& xs, const std::vector<Tensor>& gamma,
                                    const std::vector<Tensor>& beta, const std::vector<Tensor>& running_mean,
                                    const std::vector<Tensor>& running_var, float momentum = 0.1f,
                                    float eps = 1e-5f);

}  // namespace d2l
