#include "core/optim/shards.hpp"

#include <algorithm>

namespace d2l::optim::zero {

void Shards::update_my_shard_then_all_gather(const std::vector<ReplicaStep>& mine, const Step& s) {
  step_on_devices(mine, s);      // update my shard
  if (stage() < 3) all_gather();  // then all-gather (stage 3: the next forward gathers)
}

std::vector<Device> common_devices(const std::vector<std::vector<Tensor>>& weights, const std::vector<std::string>& names,
                                   int stage, const std::string& where) {
  std::vector<Device> devices;
  if (!weights.empty())
    for (auto& w : weights[0]) devices.push_back(w.device());
  for (size_t k = 0; k < weights.size(); ++k) {
    std::vector<Device> on;
    for (auto& w : weights[k]) on.push_back(w.device());
    if (on != devices)
      throw ConfigError("Trainer: zero_stage " + std::to_string(stage) + " needs every trainable parameter on the same "
                        "devices, in the same order: '" + names[0] + "' is on " + str(devices) + ", '" + names[k] +
                        "' on " + str(on) + where);
  }
  return devices.empty() ? std::vector<Device>{cpu(0)} : devices;
}

void check_loaded_slots(const std::vector<std::string>& names, const std::vector<std::vector<std::vector<float>>>& host,
                        size_t k, int64_t n) {
  if (k >= host.size()) return;
  for (const auto& slot : host[k])
    if (!slot.empty() && static_cast<int64_t>(slot.size()) != n)
      throw ShapeError("Trainer: a slot of the optimizer state of '" + names[k] + "' has " + std::to_string(slot.size()) +
                       " values but the parameter has " + std::to_string(n));
}

bool loaded_state_waits(const std::vector<std::vector<std::vector<float>>>& host) {
  return std::any_of(host.begin(), host.end(), [](auto& slots) { return !slots.empty() && !slots[0].empty(); });
}

ConfigError run_through_fsdp() {
  return ConfigError("Trainer: zero_stage 3 shards the parameters themselves: run the net through "
                     "optim::FullyShardedDataParallel(net, trainer) from its first forward on");
}

// Stage 3's calls, on holders of stages 1 and 2 (FullyShardedDataParallel checks the stage first).
static ConfigError not_stage3(const char* what) {
  return ConfigError(std::string("ZeRO shards: ") + what + " is for zero_stage 3 (FullyShardedDataParallel) only");
}

void Shards::shard_parameters(const StepInput&, const std::vector<std::vector<size_t>>&) { throw not_stage3("shard_parameters"); }
const Tensor& Shards::replica(size_t, size_t) const { throw not_stage3("replica"); }
void Shards::gather_unit(size_t, size_t) { throw not_stage3("gather_unit"); }
void Shards::release_unit(size_t, size_t) { throw not_stage3("release_unit"); }
bool Shards::gathered(size_t, size_t) const { throw not_stage3("gathered"); }
std::vector<std::vector<float>> Shards::parameters() const { throw not_stage3("parameters"); }
void Shards::set_parameters(const std::vector<std::vector<float>>&) { throw not_stage3("set_parameters"); }

}  // namespace d2l::optim::zero
