// main() of the tests that run emulated CUDA kernels, with a coverage check: every __global__ kernel
// written in the kernels/cuda/*.cu files it is given (read from the sources at test time,
// D2L_SOURCE_DIR) must have been launched by this test binary. The check runs after every selected test
// case, so it never depends on the order in which the test files or cases run (emu_ops shuffles them).
//   --kernel-coverage        the files of emu_ops: every kernels/cuda/*.cu but those an op's own test runs
//   --kernel-coverage=<op>   the file of tests/test_<op>.cpp: kernels/cuda/<op>.cu, if that test runs it,
//                            and the files holding part of its kernels (kPartOf)
// An op's test runs its emulated kernels when tests/test_<op>.cpp declares them (D2L_DECLARE_KERNEL,
// core/ops/op.hpp); then its kernels are checked there and not in emu_ops, so none falls in between.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/emu/kernels.hpp"

#ifndef D2L_SOURCE_DIR
#error "D2L_SOURCE_DIR (the project's source root) must be defined by the build"
#endif

namespace {

namespace fs = std::filesystem;
const fs::path kRoot = D2L_SOURCE_DIR;

// Names of the kernels declared as `__global__ void name(` at the start of a line in `file`
// (comments mentioning __global__ do not start a line with it).
void kernels_in(const fs::path& file, std::set<std::string>& names) {
  std::ifstream in(file);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string global, type, rest;
    if (!(words >> global >> type >> rest) || global != "__global__" || type != "void") continue;
    const std::string name = rest.substr(0, rest.find('('));
    if (!name.empty()) names.insert(name);
  }
}

// Files of kernels/cuda that hold part of an op's kernels under another name: their kernels are
// checked by that op's test (which runs them), never by emu_ops.
//   conv2d_winograd.cu   conv2d's kernel3 (tests/test_conv2d.cpp)
const std::map<std::string, std::string> kPartOf = {{"conv2d_winograd", "conv2d"}};

// Does tests/test_<op>.cpp run the op's emulated kernels itself?
bool op_test_runs_its_kernels(const std::string& op) {
  std::ifstream in(kRoot / "tests" / ("test_" + op + ".cpp"));
  std::stringstream text;
  text << in.rdbuf();
  return text.str().find("\nD2L_DECLARE_KERNEL(") != std::string::npos;
}

// The kernels the check expects: op empty means emu_ops's share.
std::set<std::string> expected_kernels(const std::string& op) {
  std::set<std::string> names;
  if (!op.empty()) {
    if (op_test_runs_its_kernels(op)) kernels_in(kRoot / "kernels" / "cuda" / (op + ".cu"), names);
    for (const auto& [part, owner] : kPartOf)
      if (owner == op) kernels_in(kRoot / "kernels" / "cuda" / (part + ".cu"), names);
    return names;
  }
  for (const auto& entry : fs::directory_iterator(kRoot / "kernels" / "cuda")) {
    const std::string stem = entry.path().stem().string();
    if (entry.path().extension() == ".cu" && !op_test_runs_its_kernels(stem) && !kPartOf.count(stem))
      kernels_in(entry.path(), names);
  }
  return names;
}

// 0 when every expected kernel ran at least once; prints the ones that did not.
int check_kernel_coverage(const std::string& op) {
  const auto expected = expected_kernels(op);
  if (expected.empty()) {
    if (!op.empty()) return 0;  // the op's kernels are emu_ops's to run
    std::printf("kernel coverage: no __global__ kernels found under %s/kernels/cuda\n", D2L_SOURCE_DIR);
    return 1;
  }
  // A template kernel is logged with its arguments ("k<F4>"): it counts under its name.
  std::map<std::string, int64_t> log;
  for (const auto& [name, count] : d2l::cuda_emu::launch_log()) log[name.substr(0, name.find('<'))] += count;
  int ran = 0;
  for (const std::string& name : expected) {
    const auto it = log.find(name);
    if (it != log.end() && it->second > 0)
      ++ran;
    else
      std::printf("  never launched: %s\n", name.c_str());
  }
  std::printf("emulated kernels: %d/%zu\n", ran, expected.size());
  return ran == static_cast<int>(expected.size()) ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool coverage = false;
  std::string op;
  std::vector<char*> args;
  const std::string flag = "--kernel-coverage";
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == flag)
      coverage = true;
    else if (a.rfind(flag + "=", 0) == 0)
      coverage = true, op = a.substr(flag.size() + 1);
    else
      args.push_back(argv[i]);
  }
  doctest::Context context(static_cast<int>(args.size()), args.data());
  const int rc = context.run();
  if (context.shouldExit() || !coverage) return rc;
  const int missing = check_kernel_coverage(op);
  if (missing) std::printf("kernel coverage: FAILED (some __global__ kernel never ran)\n");
  return rc != 0 ? rc : missing;
}
