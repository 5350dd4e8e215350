// The smoke MLP (chapters/mlp_smoke) on GPU devices, real or emulated, against the same run on CPU
// devices: the check chapters/mlp_smoke/test_mlp_smoke.cpp and tests/gpu/test_gpu_ops.cpp share.
#pragma once
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "chapters/mlp_smoke/mlp_smoke.hpp"
#include "core/runtime.hpp"

namespace d2l::test {

// 3 epochs on 1000 training and 300 test examples, on `cpus` and then on `gpus` (as many devices):
// every epoch's loss on the GPUs within 1e-4 (relative) of the CPUs', and a test accuracy above 90%
// there. Returns the GPUs' run.
inline smoke::Result smoke_on_gpus_as_on_cpus(const std::vector<Device>& cpus, const std::vector<Device>& gpus) {
  smoke::Config cfg;
  cfg.verbose = false;
  cfg.num_epochs = 3;
  cfg.n_train = 1000;
  cfg.n_test = 300;
  cfg.devices = cpus;
  use_devices(cfg.devices);
  const smoke::Result on_cpu = smoke::run(cfg);
  cfg.devices = gpus;
  use_devices(cfg.devices);
  const smoke::Result on_gpu = smoke::run(cfg);
  for (size_t e = 0; e < on_cpu.epoch_loss.size(); ++e)
    CHECK(std::fabs(on_cpu.epoch_loss[e] - on_gpu.epoch_loss[e]) <= 1e-4 * on_cpu.epoch_loss[e]);
  CHECK(on_gpu.test_acc > 0.9);
  return on_gpu;
}

}  // namespace d2l::test
