// Launching an emulated grid, and the process-wide launch log.
//   D2L_LAUNCH(kernel, grid, block, shmem_bytes, stream)(args...)          (cuda_emu.hpp)
//   -> make_launch("kernel", kernel, grid, block, shmem_bytes, stream)(args...)
// The "stream" of an emulated launch is the emu device's thread budget, a const cpu::Ctx*
// (null: the calling thread alone). Blocks are spread over at most stream->threads OS threads
// (the calling thread plus the Ctx's pool helpers), each taking the next block from a shared
// counter; the threads of one block run as fibers on one OS thread (block.hpp). The launch
// returns when the whole grid has finished (like a launch followed by cudaStreamSynchronize),
// and throws the first error as one line naming the kernel.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "kernels/cpu/parallel.hpp"
#include "kernels/emu/builtins.hpp"

namespace d2l::cuda_emu {

using builtins::dim3;
using Stream = const d2l::kernels::cpu::Ctx*;

struct LaunchConfig {
  const char* kernel;  // name as written at the launch (the launch log's key)
  const void* fn;      // its address: the key of its shared-memory opt-in (set_max_dynamic_shared)
  dim3 grid, block;
  size_t dynamic_shared;  // bytes
  Stream stream;
};

// Runs body(ctx) as every thread of every block. Checks the configuration as CUDA does
// (1..1024 threads a block, block.z <= 64, grid.y and grid.z <= 65535, shared memory <= 48 KiB or,
// for a kernel opted in, its dynamic bytes up to its opt-in and 227 KiB in all).
void run_grid(const LaunchConfig& cfg, void (*body)(void*), void* ctx);

// How blocks ran since the start or the last clear, all launches: as a plain loop to the end
// (no thread reached a barrier), or on a fiber per thread (block.hpp).
struct BlockCounts {
  int64_t plain = 0, fibers = 0;
};
BlockCounts block_counts();
void clear_block_counts();
// Whether blocks start as a plain loop (the default) or on a fiber per thread from the start, for
// tests and benchmarks that compare the two; results are the same either way.
void set_plain_blocks(bool on);

// Launch log: kernel name -> number of launches since the start or the last clear, all threads.
std::map<std::string, int64_t> launch_log();
void clear_launch_log();

// The object D2L_LAUNCH(...) makes; calling it with the kernel's arguments runs the grid.
template <class... P>
class Launch {
 public:
  Launch(LaunchConfig cfg, void (*kernel)(P...)) : cfg_(cfg), kernel_(kernel) {}

  template <class... A>
  void operator()(A&&... args) const {
    static_assert(sizeof...(A) == sizeof...(P), "kernel launched with the wrong number of arguments");
    // As CUDA does, the arguments are converted to the parameter types once, at the launch;
    // every emulated thread then receives its own copy (kernel parameters are by value).
    std::tuple<std::decay_t<P>...> params(std::forward<A>(args)...);
    auto body = [kernel = kernel_, &params] { std::apply(kernel, params); };
    run_grid(cfg_, [](void* f) { (*static_cast<decltype(body)*>(f))(); }, &body);
  }

 private:
  LaunchConfig cfg_;
  void (*kernel_)(P...);
};

template <class... P>
Launch<P...> make_launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, size_t shmem,
                         Stream stream) {
  return Launch<P...>(LaunchConfig{name, reinterpret_cast<const void*>(kernel), grid, block, shmem, stream}, kernel);
}

}  // namespace d2l::cuda_emu
