// Training checkpoints (README.md "The layer", Files): everything needed to go on
// training bit for bit, in ONE safetensors file (core/io/safetensors.hpp), written atomically:
//   - the parameters under their dotted names, as save_parameters writes them (device 0's replica,
//     running statistics included), so the file also loads with load_parameters or in PyTorch;
//   - the other devices' replicas of states without a gradient (BatchNorm's running statistics are
//     kept per device) as "replica/<i>/<name>", 1 <= i < the device count;
//   - the trainer's state_dict() under "trainer/<key>" ("trainer/momentum/0.weight"; Adam's
//     "trainer/exp_avg/0.weight" and "trainer/exp_avg_sq/0.weight"; "trainer/num_update",
//     "trainer/learning_rate"), F32;
//   - in "__metadata__" (strings): "format": "d2l-checkpoint", "devices": the kind of each device it
//     was written on ("cpu,cpu"), "epoch": the epochs completed, "rng_seed" and "rng_offset": the
//     random stream's state (core/rng.hpp).
// Loading checks everything first (the file's format, the metadata: epoch 0 to 2^31 - 1, known device
// kinds; the parameters as load_parameters does, finite values included; every replica present and
// finite; the trainer state finite, then through Trainer::load_state_dict, which checks before it
// changes) and changes nothing unless all of it is right. Resuming on another number of devices
// than the file's is refused (its per-device statistics would be dropped or made up). Then it sets
// the parameters on `devices` and the RNG state, and returns the epoch, so training resumes with epoch + 1. A net whose shapes are
// still deferred takes them from the file, as with load_parameters.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/nn/block.hpp"
#include "core/optim/trainer.hpp"

namespace d2l::io {

void save_checkpoint(const std::string& path, const nn::Block& block, const optim::Trainer& trainer, int64_t epoch);

// `devices`: where the parameters live afterwards, normally the devices the trainer was made for.
int64_t load_checkpoint(const std::string& path, nn::Block& block, optim::Trainer& trainer,
                        const std::vector<Device>& devices);

}  // namespace d2l::io
