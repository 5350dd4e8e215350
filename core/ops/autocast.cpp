// Autocast (core/ops.hpp): the open scope's type, and the one list of which op runs in which type.
#include "core/ops/op.hpp"

#include <cstring>
#include <functional>
#include <string>
#include <unordered_map>

#include "core/autograd.hpp"

namespace d2l {

namespace {
thread_local DType t_autocast = DType::f32;  // f32: no scope open on this thread
thread_local int t_open = 0;                 // scopes open on this thread
// The casts of parameters (Parameter replicas that want a gradient) made since the outermost scope opened, by
// leaf and type: one 16-bit copy of a weight however many ops and micro-batches read it (PyTorch's
// autocast cache). Dropped when the outermost scope closes.
struct CastKey {
  const TensorImpl* leaf;
  DType type;
  bool operator==(const CastKey& o) const { return leaf == o.leaf && type == o.type; }
};
struct CastKeyHash {
  size_t operator()(const CastKey& k) const { return std::hash<const void*>()(k.leaf) ^ static_cast<size_t>(k.type); }
};
thread_local std::unordered_map<CastKey, Tensor, CastKeyHash> t_casts;
}  // namespace

Autocast::Autocast(DType t) : saved_(t_autocast) {
  if (t == DType::i32) throw ConfigError("Autocast: the type must be float32, bfloat16 or float16");
  t_autocast = t;
  ++t_open;
}
Autocast::~Autocast() {
  t_autocast = saved_;
  if (--t_open == 0) t_casts.clear();
}

DType autocast_type() { return t_autocast; }

const std::vector<AutocastRule>& autocast_ops() {
  using P = AutocastPolicy;
  static const std::vector<AutocastRule> rules = {
      {"matmul", P::lower_precision, "a GEMM: 16-bit operands, float32 sums (dense's product too)"},
      {"conv2d", P::lower_precision, "a GEMM in disguise: 16-bit operands, float32 sums"},
      {"softmax_cross_entropy", P::float32, "exp and log of the logits: float16 overflows, bfloat16 is coarse"},
      {"mse_loss", P::float32, "a loss: squares and a sum"},
      {"sum", P::float32, "a reduction: long sums lose low bits in 16 bits (mean is sum, scaled)"},
      {"batch_norm", P::input_type, "16-bit in and out, its statistics and parameters float32 (PyTorch runs it in the "
                                    "input's type, cuDNN's and the CPU's kernels keeping float32 statistics)"},
      {"batch_norm_stats", P::float32, "SyncBatchNorm's statistics: reductions"},
      {"batch_norm_apply", P::float32, "SyncBatchNorm's normalisation, with float32 statistics"},
      {"bias_add", P::input_type, "a convolution's or dense layer's bias, rounded once: runs in the input's type (as "
                                  "PyTorch's)"},
      {"relu", P::input_type, "elementwise, exact in any type: runs in the input's type (as PyTorch's)"},
      {"sigmoid", P::float32, "elementwise: the kernels here are float32 (PyTorch runs it in the input's type)"},
      {"add", P::input_type, "elementwise, rounded once: runs in the input's type (two types: float32, as PyTorch "
                             "promotes to the widest)"},
      {"mul", P::float32, "elementwise: the kernels here are float32 (PyTorch promotes to the widest input)"},
      {"scale", P::float32, "elementwise: the kernels here are float32 (PyTorch runs it in the input's type)"},
      {"max_pool2d", P::input_type, "a maximum is one of its inputs: runs in the input's type (as PyTorch's)"},
      {"avg_pool2d", P::float32, "a windowed sum: the kernels here are float32"},
      {"global_avg_pool2d", P::float32, "a mean over each channel: a reduction"},
      {"argmax", P::float32, "the kernels here are float32 (no gradient)"},
      {"count_correct", P::float32, "the kernels here are float32 (no gradient)"},
      {"tp_copy_to_parallel_region", P::float32, "tensor parallelism's f: its backward all-reduces, in float32 here"},
      {"tp_reduce_from_parallel_region", P::float32, "tensor parallelism's g: an all-reduce of partial sums, in float32 here "
                                                     "(Megatron-LM reduces in the model's type)"},
  };
  return rules;
}

namespace detail {

// The list's entry for op: a scan of autocast_ops(), a few dozen comparisons of short names.
static AutocastPolicy policy_of(const char* op) {
  for (const AutocastRule& r : autocast_ops())
    if (std::strcmp(r.op, op) == 0) return r.policy;
  throw std::logic_error(std::string("autocast: the op ") + op + " is not in autocast_ops()");
}

Tensor autocast_input(const char* op, const Tensor& x) {
  const AutocastPolicy p = policy_of(op);  // every op asks, scope or not: the list must hold it
  const DType t = autocast_type();
  if (t == DType::f32 || !x.defined() || !is_float(x.dtype())) return x;
  // input_type keeps a 16-bit activation 16-bit on CPU devices, whose kernels take it; elsewhere the
  // kernels are float32.
  const bool keeps = p == AutocastPolicy::input_type && x.device().kind == DeviceKind::cpu;
  const DType to = p == AutocastPolicy::lower_precision ? t : keeps ? x.dtype() : DType::f32;
  if (x.dtype() == to) return x;
  // A parameter's copy is made once per outermost scope, while the graph is recorded (a copy made
  // without it would carry no way back to the parameter). Other leaves (a pipeline stage's received
  // activations) are cast at each use, so that two uses' gradients meet at the leaf in float32.
  if (!grad_enabled() || !x.impl().parameter || !x.impl().requires_grad || x.impl().grad_fn) return cast(x, to);
  auto [it, made] = t_casts.try_emplace(CastKey{&x.impl(), to});
  if (made) it->second = cast(x, to);
  return it->second;
}

}  // namespace detail
}  // namespace d2l
