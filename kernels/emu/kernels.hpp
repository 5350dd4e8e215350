// The emulated CUDA kernels for host code (emu(i) devices, tests): kernels/cuda/kernels.hpp's
// launchers in namespace d2l::kernels::emu. Their Stream is the emu device's thread budget,
// a const cpu::Ctx* (null = run on the calling thread only); a launcher returns when done.
#pragma once
#include "kernels/cpu/parallel.hpp"
#include "kernels/emu/launch.hpp"  // d2l::cuda_emu::launch_log(): which kernels ran, how often

namespace d2l::kernels::emu {
using Stream = const d2l::kernels::cpu::Ctx*;
}  // namespace d2l::kernels::emu

#pragma push_macro("D2L_CUDA_NS")
#undef D2L_CUDA_NS
#define D2L_CUDA_NS d2l::kernels::emu
#include "kernels/cuda/kernels.hpp"
#undef D2L_CUDA_NS
#pragma pop_macro("D2L_CUDA_NS")
