// Helpers shared by the tests of the emulated CUDA kernels in tests/test_emu_ops*.cpp: the launchers
// of kernels/cuda/kernels.hpp (the kernels several ops or the runtime share), run by
// the emulation (d2l::kernels::emu), against their kernels/cpu twins (themselves tested against
// independent double loops in tests/test_<op>.cpp), and every emulated backward against central
// finite differences of the emulated forward. The helpers themselves are tests/emu_check.hpp's.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "kernels/cpu/thread_pool.hpp"
#include "emu_check.hpp"
#include "fd_check.hpp"
#include "kernels/cpu/kernels.hpp"
#include "kernels/emu/kernels.hpp"

namespace emu_ops {

namespace cpu = d2l::kernels::cpu;
namespace kemu = d2l::kernels::emu;
using d2l::test::close;
using d2l::test::dot;
using d2l::test::lcg_data;
using d2l::test::to_double;

inline const cpu::Ctx kSerial{};  // the CPU reference runs on the calling thread

using d2l::test::count_outside;
using d2l::test::FdTol;
using d2l::test::grad_check;
using d2l::test::kFdPoints;
using d2l::test::labels_for;
using d2l::test::same_bits;
using d2l::test::to_float;
using d2l::test::TwoThreads;

}  // namespace emu_ops
