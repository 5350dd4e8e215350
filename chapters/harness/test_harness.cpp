// The chapter harness: --conv's table, the steps in flight, the file checks.
#include <doctest/doctest.h>

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "chapters/harness/harness.hpp"
#include "core/device.hpp"
#include "core/kernel_choice.hpp"

using namespace d2l;

TEST_CASE("--conv: each name selects its member of the convolution family; a bad name is one line naming the choices") {
  const Conv2dKernel before = conv2d_kernel();
  CHECK(harness::conv_kernel_names() == std::vector<std::string>{"im2col", "auto", "direct", "winograd", "winograd2", "blocked", "implicit"});
  harness::Conv conv;
  CHECK(conv.name == "auto");  // the default
  const std::pair<const char*, Conv2dKernel> members[] = {{"direct", Conv2dKernel::direct},
                                                          {"auto", Conv2dKernel::automatic},
                                                          {"winograd", Conv2dKernel::winograd},
                                                          {"winograd2", Conv2dKernel::winograd2},
                                                          {"blocked", Conv2dKernel::blocked},
                                                          {"implicit", Conv2dKernel::implicit},
                                                          {"im2col", Conv2dKernel::im2col}};
  for (auto [name, kernel] : members) {
    conv.name = name;
    conv.apply();
    CHECK(conv2d_kernel() == kernel);
  }
  for (const char* bad : {"fastest", "", "DIRECT", "im2col "}) {
    conv.name = bad;
    std::string what;
    try {
      conv.apply();
    } catch (const ConfigError& e) {
      what = e.what();
    }
    CHECK(what == "bad --conv '" + std::string(bad) + "': expected im2col, auto, direct, winograd, winograd2, blocked or implicit");
  }
  set_conv2d_kernel(before);
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

// The ranks' fingerprint is read from the parser: each flag a program adds is in it, given or not,
// except help and the per-rank ones. Walks the flags: changing any one of the others must change
// exactly the entry that names it; the per-rank ones change nothing.
TEST_CASE("flag_fingerprint: every flag as parsed, but help and the per-rank ones; each change is seen") {
  auto fingerprint = [](const std::string& args) {
    CLI::App app;
    double lr = 0.1;
    int64_t batch = 256;
    bool quick = false;
    std::string data, plot = "out.png", list;
    app.add_option("--lr", lr)->capture_default_str();
    app.add_option("--batch-size", batch)->capture_default_str();
    app.add_flag("--quick", quick);
    app.add_option("--sizes", list);
    app.add_option("--data-dir", data);
    app.add_option("--plot", plot)->capture_default_str();
    app.add_subcommand("kv")->fallthrough();
    app.parse(args, false);
    return harness::flag_fingerprint(app, {"--data-dir", "--plot"});
  };
  using F = std::vector<std::pair<std::string, std::string>>;
  const F base = fingerprint("");
  CHECK(base == F{{"--lr", "0.1"}, {"--batch-size", "256"}, {"--quick", "off"}, {"--sizes", ""}});
  CHECK(fingerprint("--lr 0.1") == base);  // a default given explicitly is the same setting
  CHECK(fingerprint("--data-dir /elsewhere --plot other.png") == base);
  for (auto [args, flag] : std::vector<std::pair<std::string, std::string>>{
           {"--lr 0.5", "--lr"}, {"--batch-size 8", "--batch-size"}, {"--quick", "--quick"}, {"--sizes 4,64", "--sizes"}}) {
    CAPTURE(args);
    const F f = fingerprint(args);
    REQUIRE(f.size() == base.size());
    for (size_t i = 0; i < f.size(); ++i) CHECK((f[i] != base[i]) == (f[i].first == flag));
  }
  const F with_sub = fingerprint("kv --lr 0.1");
  CHECK(with_sub.back() == std::pair<std::string, std::string>{"subcommand", "kv"});
}
