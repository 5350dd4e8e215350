// The kernel members a program chooses with its flags (--conv, --precision; --gemm through the
// thread budget's settings): core names them for the chapters, which reach the kernels only through
// core. The members, and the rule `automatic` follows, live with the kernels (kernels/cpu/kernels.hpp;
// docs/kernels.md explains the families).
#pragma once
#include "kernels/cpu/kernels.hpp"

namespace d2l {

// conv2d's member on every CPU device of the process (direct, im2col, winograd, winograd2, blocked,
// implicit, or automatic: one per shape).
using Conv2dKernel = kernels::cpu::Conv2dKernel;
using kernels::cpu::conv2d_kernel;
using kernels::cpu::set_conv2d_kernel;
// The arithmetic of the GPU's convolutions and GEMMs: fp32, tf32, or automatic.
using KernelPrecision = kernels::cpu::Precision;
using kernels::cpu::precision;
using kernels::cpu::set_precision;

}  // namespace d2l
