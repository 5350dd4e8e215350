// CPU kernels (namespace d2l::kernels::cpu; d2l::cpu(i) is the device): plain C++ over raw float/int32 pointers, contiguous row-major NCHW.
// One op = one file (kernels/cpu/<op>.cpp), forward and backward side by side; kernels/cuda mirrors
// these signatures. Kernels never allocate tensors and never throw for shapes: core/ops checks shapes
// first. Counts are int64_t. Declared here: the kernels several ops or the runtime call; an op's own
// kernels are declared in the two files that call them, core/ops/<op>.cpp and tests/test_<op>.cpp
// (D2L_DECLARE_KERNEL, core/ops/op.hpp), with what they compute; the shapes they take (Pool2dShape)
// are here, one type for every backend.
#pragma once
#include <cstdint>
#include <string>
#include <vector>
#include "float16.hpp"
#include "parallel.hpp"

namespace d2l::kernels::cpu {

// ---- vector_isa.cpp: the vector instruction sets the hand-vectorised kernels (GEMM kernel3, conv2d
// kernel4) are compiled for; each runs the CPU's widest unless forced (vector_isas(): those this CPU
// runs, portable first).
enum class VectorIsa { portable, avx2, avx512 };
VectorIsa best_vector_isa();
std::vector<VectorIsa> vector_isas();
const char* vector_isa_name(VectorIsa isa);
int vector_isa_floats(VectorIsa isa);  // 4 (portable: SSE's registers), 8 (AVX2) or 16 (AVX-512)

// ---- gemm.cpp: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major.
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)). beta == 0 overwrites
// C, whatever it held. A family with the same arguments, read from the top:
//   kernel1 gemm_naive    the definition's three loops: the reference
//   kernel2 gemm_blocked  loop order and cache blocking (i-k-j over blocks of B that stay in cache)
//   kernel3 gemm_packed   Goto/BLIS (gemm_packed.cpp): packed panels, five loops around a register
//                         micro-kernel compiled per ISA (gemm_isa: the CPU's widest; set_gemm_isa forces one)
//   gemm_openblas         OpenBLAS's sgemm, the library reference (1 thread per call, a block of C per device thread)
// gemm, what every op calls, runs the member set_gemm_kernel chose; automatic, the default, picks one
// per shape (gemm_auto_kernel). Every member but OpenBLAS gives the same bits for any thread count.
enum class GemmKernel { naive, blocked, packed, openblas, automatic };
void set_gemm_kernel(GemmKernel k);
GemmKernel gemm_kernel();
GemmKernel gemm_auto_kernel(int64_t M, int64_t N, int64_t K);
const char* gemm_kernel_name(GemmKernel k);  // naive, blocked, packed, openblas, auto
GemmKernel gemm_kernel_from_name(const char* name);  // automatic for "auto"; throws std::invalid_argument otherwise
int gemm_vector_floats();  // floats per vector of the GEMM that runs large products: 4, 8 or 16
std::string gemm_description();  // one line: the member and its vector width (printed by the chapters)
VectorIsa gemm_isa();
void set_gemm_isa(VectorIsa isa);
void gemm(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C);
void gemm_naive(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                const float* B, float beta, float* C);
void gemm_blocked(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  const float* B, float beta, float* C);
void gemm_packed(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 const float* B, float beta, float* C);
void gemm_openblas(const Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   const float* B, float beta, float* C);
void gemm_scale(const Ctx& c, int64_t n, float beta, float* C);  // C = beta * C (0: zeros): an empty product

// ---- gemm16.cpp: gemm's contract with A and B 16-bit (bfloat16 or float16, `f`) and C float32, as
// tensor cores and cuBLAS's GemmEx (CUBLAS_COMPUTE_32F) compute it: each product of two 16-bit values
// is exact in float32 (8 + 8 or 11 + 11 significant bits), the sums are float32's.
//   gemm16_naive    the definition's loops (sums in k's order): the reference
//   gemm16_widened  op(A) and op(B) widened into float32 scratch, then gemm: the portable member
//   gemm16          what the ops call: gemm16_dpbf16 (below) for bfloat16 on a CPU with AVX512-BF16,
//                   else gemm16_widened
void gemm16_naive(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                  const uint16_t* A, const uint16_t* B, float beta, float* C);
void gemm16_widened(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                    const uint16_t* A, const uint16_t* B, float beta, float* C);
void gemm16(const Ctx& c, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const uint16_t* A,
            const uint16_t* B, float beta, float* C);
// ---- gemm16_dpbf16.cpp: the bfloat16 member on AVX512-BF16's VDPBF16PS (pairs of k per instruction),
// which gemm16 runs for bfloat16 where the CPU has it.
//   dpbf16_lane      the instruction's arithmetic on one float32 lane (Intel's manual): acc + the high
//                    halves' product, then + the low halves', each rounded to nearest even, subnormal
//                    inputs and results zero
//   has_avx512_bf16  whether this CPU has the instruction
//   gemm16_dpbf16    the member; hw false (or no instruction): dpbf16_lane in its place, the same bits
float dpbf16_lane(float acc, uint32_t a_pair, uint32_t b_pair);
bool has_avx512_bf16();
void gemm16_dpbf16(const Ctx& c, bool hw, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                   const uint16_t* A, const uint16_t* B, float beta, float* C);

// ---- blas_check.cpp: the OpenBLAS build loaded (0 serial, 1 pthreads, 2 OpenMP); check_blas() runs
// once when the first device starts: it pins a threaded build to 1 thread per call, or, for the
// serial build (not thread-safe), makes gemm serialise its calls (blas_serialised()).
int blas_parallel_mode();
void check_blas();
bool blas_serialised();
int blas_vector_floats();      // floats per vector register of OpenBLAS's kernel set: 4 (SSE), 8 (AVX2), 16 (AVX-512)
const char* blas_core_name();  // that kernel set's name (Prescott, Haswell, SkylakeX, ...)

// ---- fill.cpp
void fill(const Ctx& c, float* x, int64_t n, float value);
void copy(const Ctx& c, const float* src, float* dst, int64_t n);  // also used for int32 via bytes
void scale(const Ctx& c, const float* x, float* y, int64_t n, float alpha);  // y = alpha * x

// ---- rng.cpp: counter-based (Philox4x32-10). Element i depends only on (seed, offset + i).
void normal(const Ctx& c, float* x, int64_t n, uint64_t seed, uint64_t offset, float mean, float stddev);
void uniform(const Ctx& c, float* x, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);

// ---- add.cpp: axpy: y += alpha * x (in-place add, grad accumulation: add_ and core/comm.cpp's
// reductions). add and mul are the add op's own (core/ops/add.cpp).
void axpy(const Ctx& c, float alpha, const float* x, float* y, int64_t n);

// ---- bias_add.cpp: x viewed as (outer, C, inner); y = x + b[c]. Dense: inner = 1; conv: inner = H*W.
void bias_add_forward(const Ctx& c, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner);
// db[c] = sum over outer and inner of dy   (dx = dy is a copy done by the caller)
void bias_add_backward(const Ctx& c, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner);

// ---- conv2d.cpp: x (N, C, H, W), w (OC, C, KH, KW), y (N, OC, OH, OW); no bias (bias_add does
// that). Backward: dx and dw are overwritten (not accumulated). A family of kernels with the same
// arguments: kernel1 direct (the definition's loops, the reference), kernel2 im2col (im2col + the
// GEMM + col2im, the textbook method), kernel3 winograd (conv2d_winograd.cpp: F(4x4, 3x3); winograd2 is
// F(2x2, 3x3)) for 3x3 stride-1 forward and backward_data (other shapes, and backward_weight, run
// im2col), kernel4 blocked (conv2d_blocked.cpp: direct loops vectorised over blocks of output
// channels, no im2col buffer). automatic, the default, picks a member per shape (conv2d_auto_kernel;
// `auto` is a keyword).
// conv2d_forward / _backward_data / _backward_weight run the member set_conv2d_kernel chose (for
// every device thread of the process).
struct Conv2dShape {
  int64_t N, C, H, W, OC, KH, KW, stride_h, stride_w, pad_h, pad_w;
  int64_t OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
};
// implicit: the GPU's kernel5 (kernels/cuda/conv2d_implicit.cu, implicit GEMM); CPU devices run kernel2 for it.
enum class Conv2dKernel { direct, im2col, winograd, winograd2, blocked, implicit, automatic };
void set_conv2d_kernel(Conv2dKernel k);
Conv2dKernel conv2d_kernel();
// --precision, for the GPU's convolutions and GEMMs (CPUs have no TF32 and always compute in FP32):
//   fp32       exact FP32 arithmetic: the SIMT kernels, cuBLAS in plain FP32
//   tf32       tensor cores with TF32 inputs (10-bit mantissa) and FP32 sums: the conv members' wmma
//              kernels, cuBLAS with TF32 tensor-op math (CUBLAS_COMPUTE_32F_FAST_TF32)
//   automatic  tf32 on real GPUs (as PyTorch's torch.backends.cudnn.allow_tf32), fp32 on emulated ones
enum class Precision { automatic, fp32, tf32 };
void set_precision(Precision p);
Precision precision();
Conv2dKernel conv2d_auto_kernel(const Conv2dShape& s);  // the member automatic runs for s's forward and backward_data
// automatic's rule on a machine whose kernel4 vectors hold `blocked_floats` floats and whose GEMM's
// (gemm_vector_floats) `gemm_floats`: the one above is this one with this machine's widths.
Conv2dKernel conv2d_auto_kernel(const Conv2dShape& s, int blocked_floats, int gemm_floats);
void conv2d_forward(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw);
// kernel1
void conv2d_forward_direct(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_direct(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_direct(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw);
// kernel2, and its two halves for one image
void conv2d_forward_im2col(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_im2col(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_im2col(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw);
// kernel2 on 16-bit operands (bfloat16 or float16 bits, `f`): im2col in 16 bits, gemm16 (VDPBF16PS for
// bfloat16 where the CPU has it), the sums and col2im in float32. What conv2d runs on bfloat16
// operands on cpu(i) with AVX512-BF16: each pass reads half the bytes, and no operand is widened first.
// y and dx are 16-bit too, each float32 sum rounded once into them (to nearest even) chunk by chunk;
// dw, the parameter's shape, stays float32.
void conv2d16_forward(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* x, const uint16_t* w, uint16_t* y);
void conv2d16_backward_data(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* dy, const uint16_t* w,
                            uint16_t* dx);
void conv2d16_backward_weight(const Ctx& c, Float16 f, const Conv2dShape& s, const uint16_t* x, const uint16_t* dy,
                              float* dw);
void im2col(const Conv2dShape& s, const float* x_img, float* col);  // one image -> col (C*KH*KW, OH*OW)
void col2im(const Conv2dShape& s, const float* col, float* dx_img);  // adds col back into one image (zeroed by caller)
// kernel3 (falls back to kernel2 where conv2d_winograd_fits is false, or, for backward_data, pad > 2)
bool conv2d_winograd_fits(const Conv2dShape& s);  // 3x3, stride 1
void conv2d_forward_winograd(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_winograd(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_forward_winograd2(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_winograd2(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
// kernel4 (conv2d_blocked.cpp): forward on any shape; backward_data where conv2d_blocked_fits_backward_data
// (stride 1, pad <= K - 1, C >= 4), else kernel2's; backward_weight. Its vector width is the CPU's
// (read at start-up; set_conv2d_blocked_isa forces one of vector_isas()).
VectorIsa conv2d_blocked_isa();
void set_conv2d_blocked_isa(VectorIsa isa);
bool conv2d_blocked_fits_backward_data(const Conv2dShape& s);
void conv2d_forward_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_blocked(const Ctx& c, const Conv2dShape& s, const float* dy, const float* w, float* dx);
// kernel4's dw (windows of 4+ taps and C >= 4; else kernel2's): vectorised over output channels, each
// value summed over images and positions in order
void conv2d_backward_weight_blocked(const Ctx& c, const Conv2dShape& s, const float* x, const float* dy, float* dw);

// ---- pool2d.cpp: the shape of a 2-D pooling window; the kernels are the pool2d op's own
// (core/ops/pool2d.cpp). x (N, C, H, W) -> y (N, C, OH, OW).
struct Pool2dShape {
  int64_t N, C, H, W, KH, KW, stride_h, stride_w, pad_h, pad_w;
  int64_t OH() const { return (H + 2 * pad_h - KH) / stride_h + 1; }
  int64_t OW() const { return (W + 2 * pad_w - KW) / stride_w + 1; }
};
// ---- batch_norm_stats.cpp: batch norm in pieces for SyncBatchNorm (one shard x (N, C, HW) each).
// stats (2, C): row 0 the mean, row 1 the biased variance (double sums, two passes). combine: K
// shards' stats (K, 2, C) with counts[j] = N_j*HW values per channel -> the whole batch's (2, C).
// apply: y = gamma * (x - mean) / sqrt(var + eps) + beta with given stats. Backward passes overwrite
// their outputs; apply's dx holds the statistics fixed (their own gradient goes to dstats).
void batch_norm_stats_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, float* stats);
void batch_norm_stats_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                               const float* dstats, float* dx);
void batch_norm_combine_forward(const Ctx& c, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                float* out);
void batch_norm_combine_backward(const Ctx& c, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                 const float* dout, float* dstats);
void batch_norm_apply_forward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                              const float* gamma, const float* beta, float eps, float* y);
void batch_norm_apply_backward(const Ctx& c, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                               const float* stats, const float* gamma, float eps, float* dx, float* dstats,
                               float* dgamma, float* dbeta);
// running = (1 - momentum) * running + momentum * batch; running_var takes var * M / (M - 1).
void batch_norm_update_running(const Ctx& c, int64_t C, int64_t M, const float* stats, float momentum,
                               float* running_mean, float* running_var);

// ---- the 16-bit activations: autocast's input-type ops on CPU devices (core/ops/autocast.cpp) keep
// bfloat16 or float16 activations (`f`) in 16 bits. The float32 kernels of bias_add.cpp, relu.cpp,
// add.cpp, pool2d.cpp and batch_norm.cpp, written once over the element type: each element read widened
// (exactly), computed as in float32, each output rounded once to nearest even. The bias,
// BatchNorm's parameters, statistics and their gradients stay float32. Max-pooling's backward sums a plane's
// gradients in float32 before it rounds them.
void bias_add16_forward(const Ctx& c, Float16 f, const uint16_t* x, const float* b, uint16_t* y, int64_t outer, int64_t C,
                        int64_t inner);
void bias_add16_backward(const Ctx& c, Float16 f, const uint16_t* dy, float* db, int64_t outer, int64_t C, int64_t inner);
void relu16_forward(const Ctx& c, Float16 f, const uint16_t* x, uint16_t* y, int64_t n);
void relu16_backward(const Ctx& c, Float16 f, const uint16_t* x, const uint16_t* dy, uint16_t* dx, int64_t n);
void add16(const Ctx& c, Float16 f, const uint16_t* a, const uint16_t* b, uint16_t* y, int64_t n);
void max_pool2d16_forward(const Ctx& c, Float16 f, const Pool2dShape& s, const uint16_t* x, uint16_t* y, int32_t* argmax);
void max_pool2d16_backward(const Ctx& c, Float16 f, const Pool2dShape& s, const uint16_t* dy, const int32_t* argmax,
                           uint16_t* dx);
void batch_norm16_train_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                                const float* gamma, const float* beta, float eps, float momentum, uint16_t* y,
                                float* mean, float* invstd, float* running_mean, float* running_var);
void batch_norm16_eval_forward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                               const float* gamma, const float* beta, const float* running_mean,
                               const float* running_var, float eps, uint16_t* y);
void batch_norm16_backward(const Ctx& c, Float16 f, int64_t N, int64_t C, int64_t HW, const uint16_t* x,
                           const uint16_t* dy, const float* gamma, const float* mean, const float* invstd, uint16_t* dx,
                           float* dgamma, float* dbeta);

}  // namespace d2l::kernels::cpu
