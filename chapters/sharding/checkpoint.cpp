// Part 1's checkpoints (core/checkpoint/sharded_checkpoint.hpp).
// --save DIR: its last run (the last stage, on the most devices or over every rank) written as a
// sharded checkpoint: each rank its own file of the optimizer state's chunk, rank 0 the parameters
// and, last, index.json. The files' sizes are read back from the disk for the report, not computed.
// --load DIR: every run of part 1 starts from such a checkpoint's parameters and optimizer state
// (its step count included) in place of the seed's: written at any stage over any number of devices
// or ranks, it is resharded into each run's layout at the run's first step.
#include <filesystem>

#include "chapters/sharding/sharding.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/checkpoint/sharded_checkpoint.hpp"
#include "core/optim/trainer.hpp"

namespace d2l::sharding {

void save_run(const Config& cfg, const nn::Block& net, const optim::Trainer& trainer, ZeroRun& run) {
  if (cfg.save_dir.empty()) return;
  io::save_sharded_checkpoint(cfg.save_dir, net, trainer, 0);
  dist::barrier();  // every rank's file is on the disk
  const int W = dist::world_size();
  auto size = [&](const std::string& name) {
    return static_cast<int64_t>(std::filesystem::file_size(std::filesystem::path(cfg.save_dir) / name));
  };
  run.saved.push_back({"index.json", size("index.json")});
  run.saved.push_back({"parameters.safetensors", size("parameters.safetensors")});
  for (int r = 0; r < W; ++r) {
    const std::string name = "rank-" + std::to_string(r) + "-of-" + std::to_string(W) + ".safetensors";
    run.saved.push_back({name, size(name)});
  }
}

void load_run(const Config& cfg, nn::Block& net, optim::Trainer& trainer) {
  if (!cfg.load_dir.empty()) io::load_sharded_checkpoint(cfg.load_dir, net, trainer);
}

}  // namespace d2l::sharding
