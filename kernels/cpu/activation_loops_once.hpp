// activation_loops.hpp's loops for the float32 kernels (bias_add.cpp, add.cpp, pool2d.cpp,
// batch_norm.cpp), in namespace d2l::kernels::cpu::loops: included once per translation unit, so a
// unity build, which puts several of those files in one, defines them once.
#pragma once
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "batch_norm_channel.hpp"
#include "float16.hpp"
#include "kernels.hpp"

namespace d2l::kernels::cpu::loops {
#include "activation_loops.hpp"
}  // namespace d2l::kernels::cpu::loops
