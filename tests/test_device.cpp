// Device names, --devices lists and --num-gpus resolution (docs/devices-and-streams.md).
#include <cblas.h>
#include <doctest/doctest.h>

#include <cstdlib>

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

// ---- Logical GPUs: plan_devices with a fake physical GPU count and D2L_LOGICAL_GPUS's text.

TEST_CASE("logical GPUs: a physical GPU listed twice gives two logical devices on it") {
  DevicePlan p = plan_devices("gpu:0,gpu:0", 1, nullptr, 1);
  CHECK(p.devices == std::vector<Device>{gpu(0), gpu(1)});
  CHECK(p.gpu_map == std::vector<int>{0, 0});
  REQUIRE(p.notes.size() == 1);
  CHECK(p.notes[0].find("gpu(0), gpu(1) are logical devices, both on physical GPU 0") != std::string::npos);
  // Renumbered in list order, each on the GPU it names; other devices keep their place.
  DevicePlan q = plan_devices("gpu:1,cpu:0,gpu:1,gpu:0", 1, nullptr, 2);
  CHECK(q.devices == std::vector<Device>{gpu(0), cpu(0), gpu(1), gpu(2)});
  CHECK(q.gpu_map == std::vector<int>{1, 1, 0});
  // Without a repeat the names are the physical GPUs', with no note.
  DevicePlan r = plan_devices("gpu:1,gpu:0", 1, nullptr, 2);
  CHECK(r.devices == std::vector<Device>{gpu(1), gpu(0)});
  CHECK(r.gpu_map == std::vector<int>{0, 1});
  CHECK(r.notes.empty());
}

TEST_CASE("logical GPUs: a GPU beyond the physical ones is an error naming it") {
  CHECK_THROWS_WITH_AS(plan_devices("gpu:0,gpu:1", 1, nullptr, 1), doctest::Contains("no device gpu(1)"), ConfigError);
  CHECK_THROWS_WITH_AS(plan_devices("gpu:0,gpu:1", 1, nullptr, 1), doctest::Contains("D2L_LOGICAL_GPUS=2"), ConfigError);
  CHECK_THROWS_WITH_AS(plan_devices("gpu:0,gpu:0", 1, nullptr, 0), doctest::Contains("no device gpu(0)"), ConfigError);
  CHECK_THROWS_WITH_AS(plan_devices("gpu:0,gpu:2", 1, "2", 1), doctest::Contains("no device gpu(2)"), ConfigError);
}

namespace {
// A plan of gpu(0) and gpu(1), logical GPUs both on physical GPU 0, with one note, which says `note`.
void check_two_logical_on_gpu0(const DevicePlan& p, const std::string& note) {
  CHECK(p.devices == std::vector<Device>{gpu(0), gpu(1)});
  CHECK(p.gpu_map == std::vector<int>{0, 0});
  REQUIRE(p.notes.size() == 1);
  CHECK(p.notes[0].find(note) != std::string::npos);
}
}  // namespace

TEST_CASE("logical GPUs: D2L_LOGICAL_GPUS=K splits each physical GPU into K") {
  CHECK(split_gpus(1, 2) == std::vector<int>{0, 0});
  CHECK(split_gpus(2, 3) == std::vector<int>{0, 0, 0, 1, 1, 1});
  CHECK(split_gpus(0, 4).empty());
  check_two_logical_on_gpu0(plan_devices("gpu:0,gpu:1", 1, "2", 1), "physical GPU 0");
  // The items name logical GPUs: each at most once.
  CHECK_THROWS_WITH_AS(plan_devices("gpu:0,gpu:0", 1, "2", 1), doctest::Contains("gpu(0) is listed twice"), ConfigError);
  // D2L_LOGICAL_GPUS=1 is the default: names are physical.
  CHECK(plan_devices("gpu:0", 1, "1", 1).gpu_map == std::vector<int>{0});
  // Logical GPUs on different physical ones share nothing: no note.
  CHECK(plan_devices("gpu:0,gpu:2", 1, "2", 2).notes.empty());
}

TEST_CASE("logical GPUs: bad D2L_LOGICAL_GPUS values are one-line errors") {
  CHECK(parse_logical_gpus(nullptr) == 1);
  CHECK(parse_logical_gpus("1") == 1);
  CHECK(parse_logical_gpus("64") == 64);
  for (const char* bad : {"", "0", "65", "-1", "two", "2.5", " 2", "2 ", "99999999999999999999"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(parse_logical_gpus(bad), doctest::Contains("bad D2L_LOGICAL_GPUS"), ConfigError);
    CHECK_THROWS_WITH_AS(plan_devices("", 2, bad, 1), doctest::Contains("from 1 to 64"), ConfigError);
  }
}

TEST_CASE("logical GPUs: cpu and emu devices listed twice stay errors") {
  for (const char* env : {static_cast<const char*>(nullptr), "2"}) {
    CHECK_THROWS_WITH_AS(plan_devices("cpu:0,cpu:0", 1, env, 1), doctest::Contains("cpu(0) is listed twice"), ConfigError);
    CHECK_THROWS_WITH_AS(plan_devices("emu:1,gpu:0,emu:1", 1, env, 1), doctest::Contains("emu(1) is listed twice"),
                         ConfigError);
  }
  CHECK_THROWS_AS(parse_devices("gpu:0,gpu:0"), ConfigError);  // repeats only where asked for
  CHECK(parse_devices("gpu:0,gpu:0", true).size() == 2);
}

TEST_CASE("logical GPUs: --num-gpus 2 with D2L_LOGICAL_GPUS=2 on one GPU") {
  check_two_logical_on_gpu0(plan_devices("", 2, "2", 1), "both on physical GPU 0");
  CHECK_THROWS_WITH_AS(plan_devices("", 3, "2", 1), doctest::Contains("--num-gpus 3"), ConfigError);
  // Without the variable one GPU is not two; with no GPU at all CPU devices stand in as before.
  CHECK_THROWS_AS(plan_devices("", 2, nullptr, 1), ConfigError);
  DevicePlan none = plan_devices("", 2, "2", 0);
  CHECK(none.devices == std::vector<Device>{cpu(0), cpu(1)});
  CHECK(none.notes.size() == 1);
  CHECK(logical_gpus_note({gpu(0), gpu(1), gpu(2)}, {0, 0, 0}).find("all on physical GPU 0") != std::string::npos);
  CHECK(logical_gpus_note({gpu(0), gpu(1)}, {0, 1}).empty());
}

TEST_CASE("the process's GPU map: identity without logical GPUs, refused moves of a GPU in use") {
  if (std::getenv("D2L_LOGICAL_GPUS")) return;  // the map then splits
  CHECK(gpu_map() == split_gpus(num_physical_gpus(), 1));
  CHECK(num_gpus() == num_physical_gpus());
  const std::vector<int> saved = gpu_map();
  set_gpu_map({0, 0});
  CHECK(num_gpus() == 2);
  CHECK(physical_gpu(1) == 0);
  CHECK_THROWS_AS(physical_gpu(2), ConfigError);
  set_gpu_map(saved);
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
