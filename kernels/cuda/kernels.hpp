// Launchers of the hand-written CUDA kernels, declared once for both builds of kernels/cuda/*.cu.
// No include guard on purpose: it is included once per namespace, with D2L_CUDA_NS and that
// namespace's Stream already defined:
//   host code using the emulated kernels   #include "kernels/emu/kernels.hpp"   (d2l::kernels::emu)
//   host code using the nvcc-built ones    #include "kernels/cuda/gpu.hpp"      (d2l::kernels::cuda)
//   a .cu file                             after "kernels/cuda/d2l_cuda.cuh"
// Pointers are device pointers (host memory for emu). Semantics mirror kernels/cpu/kernels.hpp;
// a launch returns once queued on `stream` (emulated: once finished). As there, an op's own
// launchers are declared where they are called (D2L_DECLARE_KERNEL, core/ops/op.hpp).
#include <cstdint>

#include "kernels/cpu/kernels.hpp"  // Conv2dShape, Pool2dShape: one shape type for every backend

namespace D2L_CUDA_NS {

// ---- matmul.cu: C (M, N) = alpha * op(A) (M, K) @ op(B) (K, N) + beta * C, row-major.
// op(A) = A^T when ta (A stored (K, M)); op(B) = B^T when tb (B stored (N, K)). beta == 0: C is
// not read. Which kernel of the family runs is the caller's choice (--gemm naive|tiled|...).
// tf32 (kernel5) runs on tensor cores with TF32 inputs (10-bit mantissa): not FP32's result, within
// ~K 2^-11 sum |a| |b| of it; on a GPU it needs compute capability 8.0 or later (the launcher throws).
// TF32 (matmul.cu): device_has_tf32, the current device has TF32 tensor cores (compute capability 8.0
// or later; the emulation's always do); uses_tf32, --precision's rule for the convolutions and cuBLAS:
// tf32 where the device has them, or automatic on a real GPU that has them (fp32 on emulated ones).
bool device_has_tf32();
bool uses_tf32();
enum class GemmKernel { naive = 1, tiled = 2, regblock = 3, warptiled = 4, tf32 = 5, mma = 6 };
void gemm(Stream stream, GemmKernel kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
          const float* A, const float* B, float beta, float* C);
// kernel6 (matmul_mma.cu), what gemm runs for GemmKernel::mma: TF32 through PTX's mma.sync, ldmatrix
// and cp.async (kernels/cuda/ptx.cuh).
void gemm_mma(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
              const float* B, float beta, float* C);

// ---- matmul16.cu: gemm's contract with A and B 16-bit (kernels/cpu/kernels.hpp's gemm16): sums in
// float32. GemmKernel::mma runs kernel6 on the 16-bit tensor cores (gemm16_mma); any other choice runs
// kernel2, each thread one element of C from 16 x 16 tiles of op(A) and op(B) widened in shared memory.
using Float16 = ::d2l::kernels::cpu::Float16;
void gemm16(Stream stream, GemmKernel kernel, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
            const uint16_t* A, const uint16_t* B, float beta, float* C);
// kernel6 (matmul_mma.cu, the TF32 kernel6 on 16-bit operands): mma.sync m16n8k16 on bfloat16 or
// float16, ldmatrix and cp.async; sm_80.
void gemm16_mma(Stream stream, Float16 f, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                const uint16_t* A, const uint16_t* B, float beta, float* C);

// ---- fill.cu
void fill(Stream stream, float* x, int64_t n, float value);
void copy(Stream stream, const float* src, float* dst, int64_t n);  // also used for int32 via bytes
void scale(Stream stream, const float* x, float* y, int64_t n, float alpha);  // y = alpha * x

// ---- rng.cu: Philox4x32-10, the same numbers as kernels/cpu (bit-identical, any launch shape).
void normal(Stream stream, float* x, int64_t n, uint64_t seed, uint64_t offset, float mean, float stddev);
void uniform(Stream stream, float* x, int64_t n, uint64_t seed, uint64_t offset, float lo, float hi);

// ---- add.cu: axpy: y += alpha * x (add_ and core/comm.cpp's reductions; add and mul are the add op's own)
void axpy(Stream stream, float alpha, const float* x, float* y, int64_t n);

// ---- multi_tensor.cuh: the multi-tensor optimizer steps of sgd.cu and adam.cu take a list of tensors
// in one launch; a list longer than this is launched in tables of this many tensors, one launch each.
constexpr int kMaxTensorsPerLaunch = 64;

// ---- bias_add.cu: x viewed as (outer, C, inner); y = x + b[c]. db[c] = sum over outer and inner of dy.
void bias_add_forward(Stream stream, const float* x, const float* b, float* y, int64_t outer, int64_t C,
                      int64_t inner);
void bias_add_backward(Stream stream, const float* dy, float* db, int64_t outer, int64_t C, int64_t inner);

// ---- conv2d.cu: x (N, C, H, W), w (OC, C, KH, KW) -> y (N, OC, OH, OW); no bias; dx and dw are
// overwritten. The CPU's family: kernel1 direct (conv2d_*_direct: one thread per output value, no
// col buffer, the reference), kernel2 im2col (im2col + a GEMM per image; conv2d_*_im2col) and
// kernel3 winograd (conv2d_winograd.cu: F(4x4, 3x3), winograd2 F(2x2, 3x3), for 3x3 stride-1
// forward and backward_data: the filter and input tiles transformed by their own kernels, alpha^2
// GEMMs, the output transform; other shapes, and backward_data with padding above 2, run kernel2).
// conv2d_forward / _backward_data / _backward_weight run the member kernels::cpu::set_conv2d_kernel
// chose, as on the CPU (automatic runs im2col here: no rule measured on a GPU yet).
// Which GEMM the passes call is process-wide (core's set_gemm sets it, as for the dense layers):
// `library` when set (cuBLAS on a GPU, the CPU GEMM standing in for it on emu), else the
// hand-written `kernel` of matmul.cu. The default, before any call: the tiled kernel.
using Conv2dShape = ::d2l::kernels::cpu::Conv2dShape;
using LibraryGemm = void (*)(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha,
                             const float* A, const float* B, float beta, float* C);
void set_conv2d_gemm(GemmKernel kernel, LibraryGemm library);
// Scratch buffers (common.cuh's ScratchBuffer) of nvcc-built launchers come from cudaMallocAsync;
// core counts them in the device's memory figures through this hook: +bytes when one is made on
// `stream`, -bytes when it is released. (Emulated launchers take theirs from the Ctx's workspace.)
using ScratchCounter = void (*)(Stream stream, int64_t bytes);
void set_scratch_counter(ScratchCounter f);
ScratchCounter scratch_counter();
void im2col(Stream stream, const Conv2dShape& s, const float* x_img, float* col);  // one image
void col2im(Stream stream, const Conv2dShape& s, const float* col, float* dx_img);  // adds into dx_img
// C = alpha op(A) @ op(B) + beta C with the GEMM chosen above (im2col's and kernel3's GEMMs).
void conv2d_gemm(Stream stream, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 const float* B, float beta, float* C);
void conv2d_forward(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw);
void conv2d_forward_im2col(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_im2col(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_im2col(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw);
void conv2d_forward_direct(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_direct(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_direct(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw);
// kernel5, implicit GEMM: each pass one GEMM over the whole batch, the im2col index arithmetic done
// while loading its shared-memory tiles (no col buffer, no per-image loop).
void conv2d_forward_implicit(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_implicit(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_backward_weight_implicit(Stream stream, const Conv2dShape& s, const float* x, const float* dy, float* dw);
// kernel5's block tile: 0 (automatic: 64x64 in TF32; in FP32 128x128 where that gives two blocks per SM,
// else 64x64), 64 or 128. Process-wide; tests set it to run both tiles on small shapes.
void set_conv2d_implicit_tile(int tile);
int conv2d_implicit_tile();
// kernel5's core in TF32: wmma (the warp matrix API, the default) or mma (PTX's mma.sync fed by cp.async
// pipelines, conv2d_implicit.cu). Process-wide, like the tile; FP32 runs the SIMT core either way.
enum class ImplicitCore { wmma, mma };
void set_conv2d_implicit_core(ImplicitCore core);
ImplicitCore conv2d_implicit_core();
// kernel3 (conv2d_winograd.cu): where the shape does not fit, kernel2's pass runs instead.
void conv2d_forward_winograd(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_winograd(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
void conv2d_forward_winograd2(Stream stream, const Conv2dShape& s, const float* x, const float* w, float* y);
void conv2d_backward_data_winograd2(Stream stream, const Conv2dShape& s, const float* dy, const float* w, float* dx);
// The most floats kernel3's transformed tiles (V and M) take at once: the tiles run in chunks that fit
// (default 2^24, 64 MiB). Process-wide; tests set it small to run several chunks.
void set_conv2d_winograd_workspace(int64_t floats);
int64_t conv2d_winograd_workspace();

// ---- pool2d.cu: the shape its launchers take (declared where they are called, core/ops/pool2d.cpp).
using Pool2dShape = ::d2l::kernels::cpu::Pool2dShape;
// ---- batch_norm_stats.cu: batch norm in pieces for SyncBatchNorm (one shard x (N, C, HW) each);
// stats (2, C) mean and biased variance, combine (K, 2, C) + counts -> (2, C), apply, running; as kernels/cpu.
void batch_norm_stats_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, float* stats);
void batch_norm_stats_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                               const float* dstats, float* dx);
void batch_norm_combine_forward(Stream stream, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                float* out);
void batch_norm_combine_backward(Stream stream, int64_t K, int64_t C, const int32_t* counts, const float* stats,
                                 const float* dout, float* dstats);
void batch_norm_apply_forward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* stats,
                              const float* gamma, const float* beta, float eps, float* y);
void batch_norm_apply_backward(Stream stream, int64_t N, int64_t C, int64_t HW, const float* x, const float* dy,
                               const float* stats, const float* gamma, float eps, float* dx, float* dstats,
                               float* dgamma, float* dbeta);
void batch_norm_update_running(Stream stream, int64_t C, int64_t M, const float* stats, float momentum,
                               float* running_mean, float* running_var);

}  // namespace D2L_CUDA_NS
