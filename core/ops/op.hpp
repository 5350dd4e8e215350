// What every op of core/ops shares: the checks, the kernel dispatch (D2L_KERNEL: one kernel name, three
// backends), the GEMM choice, and keep() for the storage a kernel touches. Included by core/ops/*.cpp and by the
// few runtime pieces that launch kernels themselves (parameter initialisation, the ring allreduce).
#pragma once
#include <string>
#include <vector>

#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/emu/kernels.hpp"

// Runs kernel `name` on the backend of the device whose launch context (LaunchCtx, core/runtime.hpp)
// is `ctx`: kernels/cpu for cpu(i), the hand-written CUDA kernels of kernels/cuda compiled against the
// emulation for emu(i), and the same kernels compiled by nvcc for gpu(i) (a build with CUDA). All have
// the same arguments after the first: the plain CPU Ctx ctx.cpu, the emulated stream &ctx.cpu, or the
// cudaStream_t.
#ifdef D2L_WITH_CUDA
#include "kernels/cuda/gpu.hpp"
#include "kernels/cpu/no_copy.hpp"
namespace d2l::detail {
// While alive, the gpu(i) LaunchCtx whose kernel runs on this thread: conv2d's cuBLAS GEMMs use its handle.
class GpuCtxScope : NoCopy {
 public:
  explicit GpuCtxScope(const LaunchCtx& c);
  ~GpuCtxScope();

 private:
  const LaunchCtx* prev_;
};
}  // namespace d2l::detail
#define D2L_KERNEL(ctx, name, ...)                                                                          \
  ((ctx).backend == ::d2l::Backend::gpu                                                                     \
       ? (::d2l::detail::GpuCtxScope((ctx)),                                                                \
          ::d2l::kernels::cuda::name(static_cast<::d2l::kernels::cuda::Stream>((ctx).cuda_stream), __VA_ARGS__)) \
   : (ctx).backend == ::d2l::Backend::emu ? ::d2l::kernels::emu::name(&(ctx).cpu, __VA_ARGS__)              \
                                          : ::d2l::kernels::cpu::name((ctx).cpu, __VA_ARGS__))
#else
#define D2L_KERNEL(ctx, name, ...)                                                          \
  ((ctx).backend == ::d2l::Backend::emu ? ::d2l::kernels::emu::name(&(ctx).cpu, __VA_ARGS__) \
                                        : ::d2l::kernels::cpu::name((ctx).cpu, __VA_ARGS__))
#endif

// Declares an op's own kernel `name` on every backend, with the parameters that follow the first:
// in kernels::cpu (first parameter the CPU Ctx: threads, helper pool, scratch), in kernels::emu (the
// emulated stream) and, in a build with CUDA, in kernels::cuda (the cudaStream_t), as
// kernels/cuda/kernels.hpp declares the shared ones. Written at the top of core/ops/<op>.cpp and of
// tests/test_<op>.cpp, the two files that call the op's kernels, with a comment on what each computes:
//   D2L_DECLARE_KERNEL(sigmoid_forward, const float* x, float* y, int64_t n);
// Kernels that several ops or the runtime call (fill, copy, scale, axpy, the GEMMs, the random fills,
// bias_add, conv2d's family, SyncBatchNorm's batch_norm_stats pieces) stay in kernels/cpu/kernels.hpp
// and kernels/cuda/kernels.hpp.
#ifdef D2L_WITH_CUDA
#define D2L_DECLARE_CUDA_KERNEL_(name, ...) \
  namespace d2l::kernels::cuda {            \
  void name(Stream stream, __VA_ARGS__);    \
  }
#else
#define D2L_DECLARE_CUDA_KERNEL_(name, ...)
#endif
#define D2L_DECLARE_KERNEL(name, ...)        \
  namespace d2l::kernels::cpu {              \
  void name(const Ctx& c, __VA_ARGS__);      \
  }                                          \
  namespace d2l::kernels::emu {              \
  void name(Stream stream, __VA_ARGS__);     \
  }                                          \
  D2L_DECLARE_CUDA_KERNEL_(name, __VA_ARGS__) \
  static_assert(true, "a declaration ends with ;")

namespace d2l::detail {

// All tensors defined, float32 (unless labels), on one device; returns that device.
Device same_device(const char* op, const std::vector<Tensor>& ts);
void expect_f32(const char* op, const Tensor& t, const char* what);
void expect_ndim(const char* op, const Tensor& t, int64_t n, const char* what);
void expect_same_shape(const char* op, const Tensor& a, const Tensor& b);
// A loss's per-sample values, or their sum or mean (core/ops/sum.cpp).
Tensor reduce_loss(const Tensor& per_sample, Reduction r);
// Which GEMM runs on GPUs: "cublas" (the default; on emu(i) the CPU GEMM stands in for it), or
// "tiled", "naive", "regblock", "warptiled", "tf32": the hand-written kernels of kernels/cuda/matmul.cu (nvcc-built on
// gpu(i), emulated on emu(i)). cpu(i) always uses its OpenBLAS GEMM. Convolutions on GPU devices
// follow the same choice (their im2col GEMMs).
void set_gemm(const std::string& name);
void run_gemm(const LaunchCtx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C);
// The same with A and B bfloat16 or float16 and C float32, sums in float32: cuBLAS's GemmEx on gpu(i)
// ("cublas"; any other choice runs the hand-written kernels/cuda/matmul16.cu, as on emu(i), where
// "cublas" is the CPU's gemm16 again), kernels/cpu's gemm16 on cpu(i).
void run_gemm16(const LaunchCtx& c, kernels::cpu::Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K,
                float alpha, const uint16_t* A, const uint16_t* B, float beta, float* C);

[[noreturn]] void fail(const char* op, const std::string& msg);  // throws ShapeError "op: msg"
// x as op takes it under the open Autocast scope (core/ops.hpp): cast to the scope's 16-bit type for
// a lower_precision op, to float32 for a float32 one; x itself when no scope is open, x is undefined or
// not a float. Every op that takes float tensors calls it on each (op must be in autocast_ops()).
Tensor autocast_input(const char* op, const Tensor& x);

inline std::vector<std::shared_ptr<Storage>> keep(std::initializer_list<Tensor> ts) {
  std::vector<std::shared_ptr<Storage>> out;
  for (auto& t : ts) out.push_back(t.storage());
  return out;
}

// The steps every op shares, after its own checks:
// - check_elementwise: every input defined, float32, on one device and of one shape; returns that
//   device (what an in-place op checks: add_, scale_, sgd_update_);
// - elementwise_output: those checks, then the output, uninitialised, of that shape on that device;
// - run: enqueues `kernel` (a lambda calling D2L_KERNEL) on the compute stream of the first tensor's
//   device; every tensor listed, inputs and outputs, keeps its memory until the kernel has run;
// - record (core/autograd.hpp): the backward, when a graph is being recorded.
Device check_elementwise(const char* op, std::initializer_list<Tensor> inputs);
Tensor elementwise_output(const char* op, std::initializer_list<Tensor> inputs);

// The 16-bit activations of autocast's input-type ops (bias_add, relu, add, max_pool2d, batch_norm:
// core/ops/autocast.cpp). in_16_bits: false for a float32 x; true for a bfloat16 or float16 x on a
// CPU device, whose kernels (kernels/cpu/kernels.hpp's *16) take it; elsewhere one line refusing it
// (their kernels are float32: autocast hands them float32 there). float16_of: the kernels' format.
bool in_16_bits(const char* op, const Tensor& x);
kernels::cpu::Float16 float16_of(DType t);
template <class Kernel>
void run(const char* op, std::initializer_list<Tensor> touched, Kernel&& kernel) {
  launch(touched.begin()->device(), op, keep(touched), std::forward<Kernel>(kernel));
}

// The lists of a multi-tensor op (multi_sgd_mom_update_, multi_adam_update_: one kernel launch over many
// tensors). lists[l][t] is list l's tensor t; check_elementwise holds for tensor t of every list (one
// shape, float32), every list has as many tensors, and all of them live on one device. The kernels take
// ptr[l].data() (one array per list) and n.data(); keep holds every tensor's memory until they have run.
struct TensorLists {
  Device device;
  std::vector<std::vector<float*>> ptr;  // ptr[l][t]: tensor t of list l
  std::vector<int64_t> n;                // n[t]: tensor t's elements
  std::vector<std::shared_ptr<Storage>> keep;
};
TensorLists tensor_lists(const char* op, std::initializer_list<const std::vector<Tensor>*> lists);

// An activation whose backward needs only its output (relu, sigmoid): y = forward(x) elementwise, and
// in backward gx = backward(y, gy). op and backward_op name the kernels in traces: string literals
// (streams keep the pointers). forward(c, X, Y, n) and backward(c, Y, G, GX, n) call the kernels.
// The backward keeps y's memory, not x's: x, often a BatchNorm output nothing else keeps, is then
// freed (PyTorch's ReLU(inplace=True) saves the same). Holding y's storage, not y, keeps y's graph
// node out of its own closure.
template <class Forward, class Backward>
Tensor activation(const char* op, const char* backward_op, const Tensor& x_in, Forward forward, Backward backward) {
  const Tensor x = autocast_input(op, x_in);
  Tensor y = elementwise_output(op, {x});
  const int64_t n = x.numel();
  run(op, {x, y}, [=, X = x.data(), Y = y.data()](const LaunchCtx& c) { forward(c, X, Y, n); });
  record(y, op, {x}, [=, ys = y.storage(), shape = x.shape()](const Tensor& gy) {
    Tensor gx = Tensor::empty(shape, gy.device());
    const float *Y = static_cast<const float*>(ys->ptr), *G = gy.data();
    float* GX = gx.data();
    launch(gy.device(), backward_op, {ys, gy.storage(), gx.storage()}, [=](const LaunchCtx& c) { backward(c, Y, G, GX, n); });
    return std::vector<Tensor>{gx};
  });
  return y;
}

}  // namespace d2l::detail
