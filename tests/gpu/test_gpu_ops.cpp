// GPU devices through the whole runtime, each op checked against cpu(0). With --kind gpu (meson
// test gpu_ops): the CUDA layer (core/gpu/cuda_layer.cpp), the caching allocator on cudaMalloc,
// streams with fences, copies (host, peer or staged), cuBLAS and the nvcc-built kernels; on a
// machine without a GPU it says so and exits 77, which meson reports as skipped (never as passed).
// With --kind emu (meson test gpu_ops_emulated): the same checks on emulated GPUs, which run
// everywhere, so the test itself is known to be right before it meets a real GPU.
// On a machine with one GPU the two-device cases run on two logical devices of it, gpu(0) and gpu(1)
// (core/device.hpp "Logical GPUs"): copies between them are device-to-device on one GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "chapters/mlp_smoke/mlp_smoke.hpp"
#include "tests/check.hpp"
#include "tests/smoke_on_devices.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/ops/op.hpp"
#include "core/runtime.hpp"

using namespace d2l;
using d2l::test::lcg_data;

namespace {

bool emulated = false;  // --kind emu
Device dev(int i) { return emulated ? emu(i) : gpu(i); }
int device_count() { return emulated ? 2 : num_gpus(); }

// Largest |a - b| / (1 + |a|) over two equally long vectors.
double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]) / (1.0 + std::fabs(a[i])));
  return m;
}

// A small network that uses every op with a GPU kernel, forward and backward; returns the loss
// and every gradient (flattened) computed on device d.
std::vector<std::vector<float>> network(Device d) {
  auto x = Tensor::from_vector(lcg_data(2 * 3 * 9 * 9, 1), {2, 3, 9, 9}, d).requires_grad();
  auto w = Tensor::from_vector(lcg_data(4 * 3 * 3 * 3, 2), {4, 3, 3, 3}, d).requires_grad();
  auto b = Tensor::from_vector(lcg_data(4, 3), {4}, d).requires_grad();
  auto gamma = Tensor::ones({4}, d).requires_grad(), beta = Tensor::zeros({4}, d).requires_grad();
  auto rm = Tensor::zeros({4}, d), rv = Tensor::ones({4}, d);
  auto fw = Tensor::from_vector(lcg_data(5 * 4, 4), {5, 4}, d).requires_grad();
  auto fb = Tensor::zeros({5}, d).requires_grad();
  auto labels = Tensor::from_vector(std::vector<int32_t>{1, 4}, {2}, d);

  Tensor h = conv2d(x, w, b, {2, 2}, {1, 1});           // (2, 4, 5, 5)
  h = relu(batch_norm(h, gamma, beta, rm, rv));
  Tensor p = max_pool2d(h, {2, 2}, {1, 1}) + avg_pool2d(h, {2, 2}, {1, 1});  // (2, 4, 4, 4)
  Tensor g = sigmoid(flatten(global_avg_pool2d(p)));    // (2, 4)
  Tensor logits = dense(g, fw, fb);                      // (2, 5)
  Tensor loss = softmax_cross_entropy(logits, labels) + mse_loss(scale(logits, 0.5f), mul(logits, logits));
  loss.backward();
  std::vector<int32_t> predicted = argmax(logits).to_labels();
  std::vector<float> classes(predicted.begin(), predicted.end());  // small ints: exact as floats
  return {loss.to_vector(), x.grad().to_vector(), w.grad().to_vector(), b.grad().to_vector(),
          gamma.grad().to_vector(), beta.grad().to_vector(), fw.grad().to_vector(), fb.grad().to_vector(),
          rm.to_vector(), rv.to_vector(), count_correct(logits, labels).to_vector(), classes};
}

}  // namespace

TEST_CASE("host <-> GPU copies are exact, with byte offsets; the allocator reuses its blocks") {
  auto v = lcg_data(1001, 7);
  auto t = Tensor::from_vector(v, {1001}, dev(0));
  CHECK(t.to_vector() == v);
  auto dst = Tensor::zeros({1001}, dev(0));
  copy_bytes(t, 4 * 10, dst, 4 * 500, 4 * 300);
  auto got = dst.to_vector();
  for (int i = 0; i < 300; ++i) REQUIRE(got[500 + i] == v[10 + i]);
  CHECK(got[499] == 0.0f);
  auto& alloc = *runtime(dev(0)).allocator;
  int64_t before = alloc.stats().reuses;
  { auto tmp = Tensor::empty({1001}, dev(0)); }
  { auto tmp = Tensor::empty({1001}, dev(0)); }
  waitall();
  CHECK(alloc.stats().reuses > before);
}

// With one GPU it runs on two logical devices of it (main()).
const char* const kPeerCopies =
    "copies between every pair of GPUs (peer, staged, or on one GPU between logical devices) and back to the host are exact";
TEST_CASE(kPeerCopies) {
  int n = device_count();
  REQUIRE(n >= 2);
  auto v = lcg_data(3 << 20, 9);  // 12 MB: several chunks of a staged copy
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) CHECK(Tensor::from_vector(v, {int64_t(v.size())}, dev(i)).to(dev(j)).to_vector() == v);
}

TEST_CASE("each device has its own streams, cuBLAS handle and allocator, also two logical GPUs of one") {
  if (device_count() < 2) return;
  DeviceRuntime &a = runtime(dev(0)), &b = runtime(dev(1));
  CHECK(a.allocator != b.allocator);
  CHECK(&a.compute != &b.compute);
  if (!emulated) {
    CHECK(a.gpu.compute != b.gpu.compute);
    CHECK(a.gpu.copy != b.gpu.copy);
    CHECK(a.gpu.blas != b.gpu.blas);
    CHECK(a.physical == physical_gpu(0));
    CHECK(b.physical == physical_gpu(1));
  }
  // Work on one waits for an event of the other: a copy queued after a kernel sees its result.
  auto x = Tensor::from_vector(lcg_data(1 << 16, 11), {1 << 16}, dev(0));
  auto y = scale(x, 2.0f).to(dev(1));
  auto want = x.to_vector();
  for (auto& v : want) v *= 2.0f;
  CHECK(max_diff(want, scale(y, 1.0f).to_vector()) == 0);
}

TEST_CASE("matmul on GPU 0: cuBLAS and the hand-written GEMMs match cpu(0)") {
  for (const char* g : {"cublas", "tiled", "regblock", "warptiled", "tf32", "naive"}) {
    detail::set_gemm(g);
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        CAPTURE(g);
        CAPTURE(ta);
        CAPTURE(tb);
        auto A = lcg_data(67 * 45, 1), B = lcg_data(45 * 33, 2);
        Shape sa = ta ? Shape{45, 67} : Shape{67, 45}, sb = tb ? Shape{33, 45} : Shape{45, 33};
        auto ref = matmul(Tensor::from_vector(A, sa, cpu(0)), Tensor::from_vector(B, sb, cpu(0)), ta, tb);
        auto got = matmul(Tensor::from_vector(A, sa, dev(0)), Tensor::from_vector(B, sb, dev(0)), ta, tb);
        // tf32: inputs rounded to TF32 (2^-11 relative), 45 products of values below 1: within
        // 47 * 2^-11 * 45 of FP32 at worst, ~1e-3 in practice; FP32 kernels within 1e-4.
        CHECK(max_diff(ref.to_vector(), got.to_vector()) < (std::string(g) == "tf32" ? 1e-2 : 1e-4));
      }
  }
  detail::set_gemm("cublas");
}

TEST_CASE("every op's forward and backward on GPU 0 matches cpu(0)") {
  auto ref = network(cpu(0));
  auto got = network(dev(0));
  const char* names[] = {"loss", "dx", "dw", "db", "dgamma", "dbeta", "dfw", "dfb", "running_mean", "running_var", "correct", "argmax"};
  for (size_t i = 0; i < ref.size(); ++i) {
    CAPTURE(names[i]);
    CHECK(max_diff(ref[i], got[i]) < 1e-4);
  }
}

// A 3x3 conv (padding 1, stride 1, or 2 as ResNet's downsampling layers) of 2 x 16 x 13 x 11 images to
// 24 channels and its backward on device d: y, dx, dw. At stride 2, kernel5's backward_data runs by
// parity class (kernels/cuda/conv2d_implicit.cu, BackwardDataStrided).
static std::vector<std::vector<float>> conv_passes(Device d, int64_t stride = 1) {
  const int64_t OH = (13 + 2 - 3) / stride + 1, OW = (11 + 2 - 3) / stride + 1;
  auto x = Tensor::from_vector(lcg_data(2 * 16 * 13 * 11, 5), {2, 16, 13, 11}, d).requires_grad();
  auto w = Tensor::from_vector(lcg_data(24 * 16 * 3 * 3, 6), {24, 16, 3, 3}, d).requires_grad();
  auto r = Tensor::from_vector(lcg_data(2 * 24 * OH * OW, 7), {2, 24, OH, OW}, d);
  Tensor y = conv2d(x, w, Tensor(), {stride, stride}, {1, 1});
  sum(mul(y, r)).backward();
  return {y.to_vector(), x.grad().to_vector(), w.grad().to_vector()};
}

// --conv's members on the GPU (kernels/cuda/conv2d.cu, conv2d_winograd.cu) through the op: a 3x3
// stride-1 conv and its backward against cpu(0)'s im2col; F(4x4, 3x3) rounds more (bound 1e-3).
TEST_CASE("conv2d's members on GPU 0 (direct, im2col, winograd, winograd2) match cpu(0)") {
  using kernels::cpu::Conv2dKernel;
  for (int64_t stride : {1, 2}) {
    CAPTURE(stride);
    kernels::cpu::set_conv2d_kernel(Conv2dKernel::im2col);
    const auto ref = conv_passes(cpu(0), stride);
    for (Conv2dKernel m : {Conv2dKernel::direct, Conv2dKernel::im2col, Conv2dKernel::winograd, Conv2dKernel::winograd2,
                           Conv2dKernel::implicit, Conv2dKernel::automatic}) {
      CAPTURE(int(m));
      kernels::cpu::set_conv2d_kernel(m);
      const auto got = conv_passes(dev(0), stride);
      const char* names[] = {"y", "dx", "dw"};
      for (size_t i = 0; i < ref.size(); ++i) {
        CAPTURE(names[i]);
        const double diff = max_diff(ref[i], got[i]);
        std::printf("  conv2d member %d, stride %d, on %s: %s within %.1e of cpu(0)\n", int(m), int(stride),
                    emulated ? "emu(0)" : "gpu(0)", names[i], diff);
        CHECK(diff < (m == Conv2dKernel::winograd ? 1e-3 : 1e-4));
      }
    }
  }
  kernels::cpu::set_conv2d_kernel(Conv2dKernel::automatic);  // the default
}

// --precision tf32: cuBLAS's tensor-op GEMM and kernel5 on tensor cores (the emulation's wmma on emu(0)),
// against cpu(0)'s FP32. Inputs rounded to TF32 are within 2^-11 relative, so a sum of K products of
// values below 1 is within about K * 2^-10 * max|a||b| of FP32's; the values here (K = 45, 144) stay
// near 1e-3. FP32 would be within 1e-5: the second check sees that TF32 ran on the GPU.
TEST_CASE("--precision tf32: matmul and conv2d (kernel5, automatic) on GPU 0 within TF32's error of cpu(0)") {
  using kernels::cpu::Conv2dKernel;
  using kernels::cpu::Precision;
  kernels::cpu::set_precision(Precision::tf32);
  auto A = lcg_data(67 * 45, 1), B = lcg_data(45 * 33, 2);
  auto ref = matmul(Tensor::from_vector(A, {67, 45}, cpu(0)), Tensor::from_vector(B, {45, 33}, cpu(0)));
  auto got = matmul(Tensor::from_vector(A, {67, 45}, dev(0)), Tensor::from_vector(B, {45, 33}, dev(0)));
  const double mm = max_diff(ref.to_vector(), got.to_vector());
  std::printf("  tf32 matmul (cuBLAS) on %s: within %.1e of cpu(0)\n", emulated ? "emu(0)" : "gpu(0)", mm);
  CHECK(mm < 1e-2);
  if (!emulated) CHECK(mm > 1e-6);  // the emulation's cuBLAS stand-in is the CPU GEMM: no TF32 there
  for (int64_t stride : {1, 2}) {
    CAPTURE(stride);
    kernels::cpu::set_conv2d_kernel(Conv2dKernel::im2col);
    const auto ref_conv = conv_passes(cpu(0), stride);
    // kernel5 on its wmma core (the default), then on its mma core (--gemm mma: mma.sync, cp.async).
    for (const char* gemm : {"auto", "mma"})
      for (Conv2dKernel m : {Conv2dKernel::implicit, Conv2dKernel::automatic}) {
        detail::set_gemm(gemm);
        kernels::cpu::set_conv2d_kernel(m);
        const auto out = conv_passes(dev(0), stride);
        const char* names[] = {"y", "dx", "dw"};
        for (size_t i = 0; i < out.size(); ++i) {
          CAPTURE(gemm);
          CAPTURE(int(m));
          CAPTURE(names[i]);
          const double diff = max_diff(ref_conv[i], out[i]);
          std::printf("  tf32 conv2d member %d (--gemm %s), stride %d, on %s: %s within %.1e of cpu(0)\n", int(m), gemm,
                      int(stride), emulated ? "emu(0)" : "gpu(0)", names[i], diff);
          CHECK(diff < 2e-2);
          CHECK(diff > 1e-6);  // TF32 ran: FP32 gives 1e-6 or less here
        }
      }
  }
  detail::set_gemm("auto");
  kernels::cpu::set_conv2d_kernel(Conv2dKernel::automatic);
  kernels::cpu::set_precision(Precision::fp32);
}

TEST_CASE("the smoke MLP on GPUs gives the CPU devices' losses within 1e-4") {
  const int k = std::min(2, device_count());
  test::smoke_on_gpus_as_on_cpus(k == 2 ? std::vector<Device>{cpu(0), cpu(1)} : std::vector<Device>{cpu(0)},
                                 k == 2 ? std::vector<Device>{dev(0), dev(1)} : std::vector<Device>{dev(0)});
}

int main(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::string(argv[i]) == "--kind") emulated = std::string(argv[i + 1]) == "emu";
  if (!emulated && num_gpus() == 0) {
    std::printf("skipped: no GPU (built with CUDA: %s; the CUDA runtime reports 0 devices)\n",
                built_with_cuda() ? "yes" : "no");
    return 77;
  }
  if (!emulated && num_gpus() == 1) {  // two logical devices on the one GPU
    set_gpu_map({0, 0});
    std::printf("one GPU: the two-device cases run on gpu(0) and gpu(1), logical devices both on physical GPU 0\n");
  }
  // The cases compare with cpu(0) in FP32; the TF32 case sets --precision tf32 itself.
  kernels::cpu::set_precision(kernels::cpu::Precision::fp32);
  doctest::Context ctx;
  ctx.applyCommandLine(argc, argv);
  if (device_count() < 2) {
    std::printf("skipped: \"%s\": one GPU, the case needs two\n", kPeerCopies);
    ctx.addFilter("test-case-exclude", kPeerCopies);
  }
  return ctx.run();
}
