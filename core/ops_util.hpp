// Shared checks for op implementations (core/ops_*.cpp).
#pragma once
#include <string>
#include <vector>

#include "core/autograd.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/emu/kernels.hpp"

// Runs kernel `name` on the backend of the device whose Ctx is `ctx`: kernels/cpu for cpu(i), the
// hand-written CUDA kernels of kernels/cuda (compiled against the emulation) for emu(i). Both have
// the same arguments after the first (the CPU Ctx, or the emulated stream).
#define D2L_KERNEL(ctx, name, ...)                                                   \
  ((ctx).emulated ? ::d2l::kernels::emu::name(&(ctx), __VA_ARGS__) \
                  : ::d2l::kernels::cpu::name((ctx), __VA_ARGS__))

namespace d2l::detail {

// All tensors defined, float32 (unless labels), on one device; returns that device.
Device same_device(const char* op, const std::vector<Tensor>& ts);
void expect_f32(const char* op, const Tensor& t, const char* what);
void expect_ndim(const char* op, const Tensor& t, int64_t n, const char* what);
// Which GEMM runs on emulated GPUs: "cublas" (stood in for by the CPU GEMM, the default),
// "tiled", "naive" or "regblock" (the hand-written kernels of kernels/cuda/matmul.cu, emulated).
void set_gemm(const std::string& name);
void run_gemm(const kernels::cpu::Ctx& c, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          const float* B, float beta, float* C);

[[noreturn]] void fail(const char* op, const std::string& msg);  // throws ShapeError "op: msg"

inline std::vector<std::shared_ptr<Storage>> keep(std::initializer_list<Tensor> ts) {
  std::vector<std::shared_ptr<Storage>> out;
  for (auto& t : ts) out.push_back(t.storage());
  return out;
}

}  // namespace d2l::detail
