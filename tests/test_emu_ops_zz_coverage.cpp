// Coverage of the emulated kernels: every __global__ kernel written in kernels/cuda/*.cu (read from
// the sources at test time, D2L_SOURCE_DIR) must have been launched by this test binary.
// doctest runs test cases in file order and then line order (test_emu_ops.cpp, test_emu_ops_nn.cpp,
// then this file, "zz" on purpose), so this case sees the launch log of the whole test set.
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

TEST_CASE("zz coverage: every __global__ kernel of kernels/cuda ran emulated") {
  namespace kemu = d2l::kernels::emu;
  // The GEMM family is chosen by the caller: run each member once here.
  std::vector<float> A(6, 1.0f), B(6, 1.0f), C(4);
  for (kemu::GemmKernel k : {kemu::GemmKernel::naive, kemu::GemmKernel::tiled, kemu::GemmKernel::regblock})
    kemu::gemm(nullptr, k, false, false, 2, 2, 3, 1.0f, A.data(), B.data(), 0.0f, C.data());
  CHECK(C == std::vector<float>(4, 3.0f));

  const auto declared = kernels_in_sources(std::filesystem::path(D2L_SOURCE_DIR) / "kernels" / "cuda");
  REQUIRE_MESSAGE(!declared.empty(), "no __global__ kernels found under " D2L_SOURCE_DIR "/kernels/cuda");
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
  CHECK(ran == static_cast<int>(declared.size()));
}
