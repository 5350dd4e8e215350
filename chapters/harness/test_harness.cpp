// The chapter harness: --conv's table, the steps in flight, the file checks.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "chapters/harness/harness.hpp"
#include "core/device.hpp"
#include "kernels/cpu/kernels.hpp"

using namespace d2l;
using kernels::cpu::Conv2dKernel;

TEST_CASE("--conv: each name selects its member of the convolution family; a bad name is one line naming the choices") {
  const Conv2dKernel before = kernels::cpu::conv2d_kernel();
  CHECK(harness::conv_kernel_names() == std::vector<std::string>{"im2col", "auto", "direct", "winograd", "winograd2", "blocked"});
  harness::Conv conv;
  CHECK(conv.name == "auto");  // the default
  const std::pair<const char*, Conv2dKernel> members[] = {{"direct", Conv2dKernel::direct},
                                                          {"auto", Conv2dKernel::automatic},
                                                          {"winograd", Conv2dKernel::winograd},
                                                          {"winograd2", Conv2dKernel::winograd2},
                                                          {"blocked", Conv2dKernel::blocked},
                                                          {"im2col", Conv2dKernel::im2col}};
  for (auto [name, kernel] : members) {
    conv.name = name;
    conv.apply();
    CHECK(kernels::cpu::conv2d_kernel() == kernel);
  }
  for (const char* bad : {"fastest", "", "DIRECT", "im2col "}) {
    conv.name = bad;
    std::string what;
    try {
      conv.apply();
    } catch (const ConfigError& e) {
      what = e.what();
    }
    CHECK(what == "bad --conv '" + std::string(bad) + "': expected im2col, auto, direct, winograd, winograd2 or blocked");
  }
  kernels::cpu::set_conv2d_kernel(before);
}

TEST_CASE("steps in flight: the oldest retires first, never more than n are queued") {
  std::vector<int> retired;
  harness::InFlight<int> flight(2, [&](int& s) { retired.push_back(s); });
  for (int s = 0; s < 5; ++s) {
    flight.wait_for_room();
    CHECK(flight.size() < 2);
    flight.push(s);
  }
  CHECK(retired == std::vector<int>{0, 1, 2});
  flight.drain();
  CHECK(retired == std::vector<int>{0, 1, 2, 3, 4});
  CHECK(flight.size() == 0);
}

TEST_CASE("files: outputs that cannot be written and inputs that are not there name their flag") {
  CHECK_NOTHROW(harness::check_outputs({{"--plot", ""}, {"--checkpoint", ""}}));
  CHECK_THROWS_WITH_AS(harness::check_outputs({{"--plot", ""}, {"--checkpoint", "/nonexistent/dir/ck.safetensors"}}),
                       doctest::Contains("--checkpoint"), ConfigError);
  CHECK_THROWS_WITH_AS(harness::check_readable("--resume", "/nonexistent/ck.safetensors"),
                       "bad --resume '/nonexistent/ck.safetensors': no such file", ConfigError);
  CHECK_THROWS_WITH_AS(harness::check_readable("--load-params", "/"), "bad --load-params '/': not a regular file", ConfigError);
}
