// Coverage of the emulated kernels: every __global__ kernel written in kernels/cuda/*.cu (read from
// the sources at test time, D2L_SOURCE_DIR) must have been launched by this test binary. The check
// runs in main() after every selected test case, when --kernel-coverage is given (the meson test of
// the whole set, which also shuffles the cases: --order-by=rand), so it never depends on the order in
// which the test files or cases run.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <set>
#include <string>
#include <vector>

#include "kernels/emu/kernels.hpp"

#ifndef D2L_SOURCE_DIR
#error "D2L_SOURCE_DIR (the project's source root) must be defined by the build"
#endif

namespace {

// Names of the kernels declared as `__global__ void name(` at the start of a line in kernels/cuda/*.cu
// (comments mentioning __global__ do not start a line with it).
std::set<std::string> kernels_in_sources(const std::filesystem::path& dir) {
  std::set<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".cu") continue;
    std::ifstream in(entry.path());
    std::string line;
    while (std::getline(in, line)) {
      std::istringstream words(line);
      std::string global, type, rest;
      if (!(words >> global >> type >> rest) || global != "__global__" || type != "void") continue;
      const std::string name = rest.substr(0, rest.find('('));
      if (!name.empty()) names.insert(name);
    }
  }
  return names;
}

}  // namespace

TEST_CASE("the GEMM family runs emulated: naive, tiled and register-blocked") {
  namespace kemu = d2l::kernels::emu;
  // The GEMM family member is chosen by the caller: run each once here.
  std::vector<float> A(6, 1.0f), B(6, 1.0f), C(4);
  for (kemu::GemmKernel k : {kemu::GemmKernel::naive, kemu::GemmKernel::tiled, kemu::GemmKernel::regblock}) {
    std::fill(C.begin(), C.end(), 0.0f);
    kemu::gemm(nullptr, k, false, false, 2, 2, 3, 1.0f, A.data(), B.data(), 0.0f, C.data());
    CHECK(C == std::vector<float>(4, 3.0f));
  }
}

namespace {
// 0 when every declared kernel ran at least once; prints the ones that did not.
int check_kernel_coverage() {
  const auto declared = kernels_in_sources(std::filesystem::path(D2L_SOURCE_DIR) / "kernels" / "cuda");
  if (declared.empty()) {
    std::printf("kernel coverage: no __global__ kernels found under %s/kernels/cuda\n", D2L_SOURCE_DIR);
    return 1;
  }
  const auto log = d2l::cuda_emu::launch_log();
  int ran = 0;
  for (const std::string& name : declared) {
    const auto it = log.find(name);
    if (it != log.end() && it->second > 0)
      ++ran;
    else
      std::printf("  never launched: %s\n", name.c_str());
  }
  std::printf("emulated kernels: %d/%zu\n", ran, declared.size());
  return ran == static_cast<int>(declared.size()) ? 0 : 1;
}
}  // namespace

int main(int argc, char** argv) {
  bool coverage = false;
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) {
    if (std::string(argv[i]) == "--kernel-coverage")
      coverage = true;
    else
      args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  const int rc = context.run();
  if (context.shouldExit() || !coverage) return rc;
  const int missing = check_kernel_coverage();
  if (missing) std::printf("kernel coverage: FAILED (some __global__ kernel never ran)\n");
  return rc != 0 ? rc : missing;
}
