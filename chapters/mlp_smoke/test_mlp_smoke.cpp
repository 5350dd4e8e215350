// The smoke MLP learns the generated problem on 1 and on 2 CPU devices, and the two runs agree.
#include <doctest/doctest.h>

#include <cmath>

#include "chapters/mlp_smoke/mlp_smoke.hpp"
#include "core/runtime.hpp"
#include "tests/smoke_on_devices.hpp"

using namespace d2l;

TEST_CASE("the MLP trains to > 90% on 1 and 2 CPU devices with the same final loss") {
  smoke::Config cfg;
  cfg.verbose = false;
  cfg.num_epochs = 10;
  cfg.devices = {cpu(0)};
  use_devices(cfg.devices);
  auto one = smoke::run(cfg);
  cfg.devices = {cpu(0), cpu(1)};
  use_devices(cfg.devices);
  auto two = smoke::run(cfg);
  CHECK(one.test_acc > 0.9);
  CHECK(two.test_acc > 0.9);
  CHECK(one.epoch_loss.back() < 0.5 * one.epoch_loss.front());  // the loss fell
  double rel = std::fabs(one.epoch_loss.back() - two.epoch_loss.back()) / one.epoch_loss.back();
  MESSAGE("test acc " << one.test_acc << " / " << two.test_acc << ", final loss 1 device " << one.epoch_loss.back() << ", 2 devices " << two.epoch_loss.back() << ", rel " << rel);
  CHECK(rel < 1e-5);
  // Each device computed half of every batch: both ran kernels, about equally many.
  REQUIRE(two.kernels_per_device.size() == 2);
  CHECK(two.kernels_per_device[1] > 0);
  CHECK(std::abs((double)two.kernels_per_device[0] - (double)two.kernels_per_device[1]) <
        0.5 * two.kernels_per_device[1]);
}

TEST_CASE("a batch smaller than the device count is a configuration error") {
  smoke::Config cfg;
  cfg.verbose = false;
  cfg.batch_size = 1;
  cfg.devices = {cpu(0), cpu(1)};
  CHECK_THROWS_WITH_AS(smoke::run(cfg), doctest::Contains("--batch-size 1"), ConfigError);
}

TEST_CASE("the same MLP on two emulated GPUs: the CUDA kernels give the CPU devices' losses") {
  const smoke::Result on_emu = test::smoke_on_gpus_as_on_cpus({cpu(0), cpu(1)}, {emu(0), emu(1)});
  CHECK(on_emu.kernels_per_device[1] > 0);
}
