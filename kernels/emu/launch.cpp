// Grid launch over the device's threads, and the launch log (see launch.hpp).
#include "kernels/emu/launch.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <stdexcept>

#include "kernels/cpu/thread_pool.hpp"
#include "kernels/emu/block.hpp"

namespace d2l::cuda_emu {

namespace {

std::mutex& log_mutex() {
  static std::mutex mu;
  return mu;
}
std::map<std::string, int64_t>& log_map() {
  static std::map<std::string, int64_t> log;
  return log;
}

// "(kernel<64, 4>)" -> "kernel<64, 4>": a template kernel is written in parentheses at the launch.
std::string clean_name(const char* name) {
  std::string s(name);
  while (s.size() >= 2 && s.front() == '(' && s.back() == ')') s = s.substr(1, s.size() - 2);
  return s;
}

std::string str3(dim3 v) {
  return "(" + std::to_string(v.x) + "," + std::to_string(v.y) + "," + std::to_string(v.z) + ")";
}

// CUDA's launch limits (compute capability 7.5 and later). One line naming what is wrong.
void check_config(const std::string& name, const LaunchConfig& c) {
  auto fail = [&](const std::string& why) {
    throw std::invalid_argument("invalid launch of kernel " + name + ": grid " + str3(c.grid) + ", block " +
                                str3(c.block) + ", " + std::to_string(c.dynamic_shared) + " shared bytes: " + why);
  };
  const dim3 b = c.block, g = c.grid;
  if (b.x == 0 || b.y == 0 || b.z == 0 || g.x == 0 || g.y == 0 || g.z == 0) fail("every dimension must be >= 1");
  if (uint64_t{b.x} * b.y * b.z > 1024) fail("more than 1024 threads a block");
  if (b.x > 1024 || b.y > 1024 || b.z > 64) fail("block dimensions are limited to (1024, 1024, 64)");
  if (g.x > 2147483647u || g.y > 65535 || g.z > 65535) fail("grid dimensions are limited to (2^31-1, 65535, 65535)");
  const size_t opted = max_dynamic_shared(c.fn);
  if (c.dynamic_shared > kSharedBytes && c.dynamic_shared > opted)
    fail(opted ? "more dynamic shared memory than the kernel opted in to (" + std::to_string(opted) + " bytes)"
               : std::string("more than 48 KiB of dynamic shared memory (without an opt-in, D2L_SET_MAX_DYNAMIC_SHARED)"));
}

std::mutex& opt_in_mutex() {
  static std::mutex m;
  return m;
}
std::map<const void*, size_t>& opt_ins() {
  static std::map<const void*, size_t> m;
  return m;
}

std::atomic<int64_t> g_plain{0}, g_fibers{0};
std::atomic<bool> g_plain_on{true};

}  // namespace

void set_max_dynamic_shared(const void* kernel, size_t bytes) {
  if (bytes > kSharedOptInBytes)
    throw std::invalid_argument("set_max_dynamic_shared: " + std::to_string(bytes) + " bytes, more than the " +
                                std::to_string(kSharedOptInBytes) + " (227 KiB) a block may opt in to");
  std::lock_guard<std::mutex> lock(opt_in_mutex());
  opt_ins()[kernel] = bytes;
}

size_t max_dynamic_shared(const void* kernel) {
  std::lock_guard<std::mutex> lock(opt_in_mutex());
  auto it = opt_ins().find(kernel);
  return it == opt_ins().end() ? 0 : it->second;
}

BlockCounts block_counts() { return {g_plain.load(), g_fibers.load()}; }
void clear_block_counts() {
  g_plain = 0;
  g_fibers = 0;
}
void set_plain_blocks(bool on) { g_plain_on = on; }

std::map<std::string, int64_t> launch_log() {
  std::lock_guard<std::mutex> lock(log_mutex());
  return log_map();
}

void clear_launch_log() {
  std::lock_guard<std::mutex> lock(log_mutex());
  log_map().clear();
}

void run_grid(const LaunchConfig& cfg, void (*body)(void*), void* ctx) {
  const std::string name = clean_name(cfg.kernel);
  check_config(name, cfg);
  if (Fiber::inside())
    throw std::logic_error("kernel " + name + " launched from inside a kernel (dynamic parallelism is not emulated)");
  {
    std::lock_guard<std::mutex> lock(log_mutex());
    ++log_map()[name];
  }

  const size_t limit = max_dynamic_shared(cfg.fn) > 0 ? kSharedOptInBytes : kSharedBytes;
  const BlockJob job{name.c_str(), cfg.grid, cfg.block, cfg.dynamic_shared, limit, body, ctx};
  const uint64_t gx = cfg.grid.x, gy = cfg.grid.y;
  const int64_t blocks = static_cast<int64_t>(gx * gy * cfg.grid.z);
  std::atomic<int64_t> next{0};
  std::atomic<bool> failed{false};
  const bool plain = g_plain_on.load(std::memory_order_relaxed);
  auto worker = [&](int) {
    BlockRunner& runner = BlockRunner::local();
    int64_t n_plain = 0, n_fibers = 0;
    struct Count {  // added once per worker, also when a block throws
      int64_t &p, &f;
      ~Count() {
        g_plain.fetch_add(p, std::memory_order_relaxed);
        g_fibers.fetch_add(f, std::memory_order_relaxed);
      }
    } count{n_plain, n_fibers};
    while (!failed.load(std::memory_order_relaxed)) {
      const int64_t b = next.fetch_add(1, std::memory_order_relaxed);
      if (b >= blocks) return;
      const uint64_t ub = static_cast<uint64_t>(b);
      const builtins::uint3 idx{static_cast<unsigned>(ub % gx), static_cast<unsigned>(ub / gx % gy),
                                static_cast<unsigned>(ub / (gx * gy))};
      try {
        ++(runner.run(job, idx, plain) ? n_plain : n_fibers);
      } catch (...) {
        failed.store(true);  // the other workers stop taking blocks
        throw;
      }
    }
  };

  const auto* s = cfg.stream;
  int workers = 1;
  if (s && s->pool) workers = std::min(s->threads, s->pool->helpers() + 1);
  workers = static_cast<int>(std::min<int64_t>(std::max(workers, 1), blocks));
  if (workers <= 1)
    worker(0);
  else
    s->pool->run(workers, worker);  // rethrows the first error after every worker stopped
}

// builtins.hpp's __ldg of a misaligned address: the error a GPU reports (the block's fiber carries it
// out of the launch).
void misaligned_load(const void* p, size_t bytes) {
  char where[32];
  std::snprintf(where, sizeof where, "%p", p);
  throw std::runtime_error("misaligned address: a " + std::to_string(bytes) + "-byte load from " + where);
}

}  // namespace d2l::cuda_emu
