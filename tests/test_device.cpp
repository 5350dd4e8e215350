// Device names, --devices lists and --num-gpus resolution (DESIGN.md "Devices, streams, memory").
#include <cblas.h>
#include <doctest/doctest.h>

#include "core/device.hpp"
#include "core/runtime.hpp"
#include "kernels/cpu/kernels.hpp"

using namespace d2l;

TEST_CASE("devices print as the book prints contexts") {
  CHECK(cpu(0).str() == "cpu(0)");
  CHECK(gpu(1).str() == "gpu(1)");
  CHECK(emu(2).str() == "emu(2)");
  CHECK(str(std::vector<Device>{cpu(0), cpu(1)}) == "[cpu(0), cpu(1)]");
}

TEST_CASE("parse_devices accepts mixed lists and rejects bad items") {
  auto ds = parse_devices("gpu:0,cpu:1,emu(3)");
  REQUIRE(ds.size() == 3);
  CHECK(ds[0] == gpu(0));
  CHECK(ds[1] == cpu(1));
  CHECK(ds[2] == emu(3));
  for (const char* bad : {"cpu:x", "cpu:", "tpu:0", "cpu:-1", "", "cpu:0,,cpu:1", "cpu:0,", "cpu:0,cpu:0", "cpu(1"})
    CHECK_THROWS_AS(parse_devices(bad), ConfigError);
  try {
    parse_devices("cpu:x");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("'cpu:x'") != std::string::npos);
  }
}

TEST_CASE("--num-gpus: GPUs when present, CPU devices with a note when none, an error in between") {
  auto two = resolve_num_gpus(2, 4);
  CHECK(two.devices == std::vector<Device>{gpu(0), gpu(1)});
  CHECK(two.note.empty());
  auto none = resolve_num_gpus(2, 0);
  CHECK(none.devices == std::vector<Device>{cpu(0), cpu(1)});
  CHECK(none.note.find("no GPU") != std::string::npos);
  CHECK_THROWS_WITH_AS(resolve_num_gpus(3, 1), doctest::Contains("--devices"), ConfigError);
  CHECK_THROWS_AS(resolve_num_gpus(0, 0), ConfigError);
  CHECK_THROWS_AS(resolve_num_gpus(-1, 0), ConfigError);
}

TEST_CASE("backends that are not built say so instead of crashing") {
  CHECK(backend_built(DeviceKind::cpu));
  if (!backend_built(DeviceKind::emu)) CHECK_THROWS_WITH_AS(runtime(emu(0)), doctest::Contains("not built"), ConfigError);
  if (!backend_built(DeviceKind::gpu)) CHECK_THROWS_WITH_AS(runtime(gpu(0)), doctest::Contains("not built"), ConfigError);
  CHECK(backend_built(DeviceKind::gpu) == built_with_cuda());
}

TEST_CASE("a GPU index beyond the machine's count is a configuration error naming the count") {
  if (!built_with_cuda()) return;  // covered above: "not built"
  int n = num_gpus();
  std::string expected = "this machine has " + std::to_string(n) + " GPU";
  CHECK_THROWS_WITH_AS(runtime(gpu(n)), doctest::Contains(expected.c_str()), ConfigError);
}

TEST_CASE("thread budget: cores shared among the CPU devices in use") {
  int cores = num_cores();
  CHECK(use_devices({cpu(0)}) == cores);
  CHECK(runtime(cpu(0)).threads() == cores);
  int each = use_devices({cpu(0), cpu(1)});
  CHECK(each == std::max(1, cores / 2));
  CHECK(runtime(cpu(1)).threads() == each);
}

TEST_CASE("a thread-safe (threaded) OpenBLAS is loaded and pinned to one thread per call") {
  runtime(cpu(0));
  CHECK(kernels::cpu::blas_parallel_mode() != 0);  // 1 pthreads (the one installed), 2 OpenMP
  CHECK(openblas_get_num_threads() == 1);
  CHECK_FALSE(kernels::cpu::blas_serialised());  // GEMMs of different devices overlap
}

TEST_CASE("the GPU count is answered cleanly, also by the CUDA build on a machine without a GPU") {
  int n = num_gpus();
  CHECK(n >= 0);
  MESSAGE("built with CUDA: " << std::string(built_with_cuda() ? "yes" : "no") << ", GPUs: " << n);
  if (n == 0) CHECK(resolve_num_gpus(2, n).devices == std::vector<Device>{cpu(0), cpu(1)});
}
