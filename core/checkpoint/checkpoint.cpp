#include "core/checkpoint/checkpoint.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <map>

#include "core/checkpoint/parameters_file.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::io {

namespace {

const std::string kTrainer = "trainer/";
const std::string kReplica = "replica/";
const std::string kFormat = "d2l-checkpoint";
// The programs count epochs in an int: a larger epoch would wrap (and run for billions of epochs).
const uint64_t kMaxEpoch = 2147483647;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw FileError(path + ": " + what); }

// Text that must be a whole number >= 0 in decimal, all of it.
bool parse_whole(const std::string& s, uint64_t& v) {
  auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  return !s.empty() && ec == std::errc() && end == s.data() + s.size();
}

uint64_t metadata_whole(const SafetensorsFile& file, const std::string& key, const std::string& path) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) fail(path, "checkpoint has no \"" + key + "\" in __metadata__");
  uint64_t v = 0;
  if (!parse_whole(it->second, v))
    fail(path, "checkpoint's __metadata__ \"" + key + "\" is \"" + it->second.substr(0, 40) + "\", expected a whole number");
  return v;
}

// The trainer state of the file: the "trainer/" tensors, F32, under their keys without the prefix.
std::map<std::string, optim::HostTensor> trainer_state(const SafetensorsFile& file, const std::string& path) {
  std::map<std::string, optim::HostTensor> state;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(kTrainer, 0) != 0) continue;
    if (t.dtype != FileDtype::f32)
      throw ParameterError(path + ": trainer state '" + name + "' has dtype " + dtype_name(t.dtype) + ", expected F32");
    state[name.substr(kTrainer.size())] = optim::HostTensor{t.shape, t.floats()};
  }
  return state;
}

// A state without a gradient (BatchNorm's running statistics) differs per device: its replica on
// the i-th device (i >= 1) is saved as "replica/<i>/<name>", so that resuming on as many devices
// continues bit for bit. (Trained parameters are equal on every device after each step.)
struct ReplicaValues {
  nn::ParameterPtr param;
  size_t index;
  const FileTensor* values;
};

std::vector<ReplicaValues> match_replicas(const nn::ParameterDict& params, const SafetensorsFile& file,
                                          const std::string& path) {
  std::vector<ReplicaValues> out;
  for (auto& [name, t] : file.tensors) {
    if (name.rfind(kReplica, 0) != 0) continue;
    size_t slash = name.find('/', kReplica.size());
    uint64_t i = 0;
    bool ok = slash != std::string::npos && parse_whole(name.substr(kReplica.size(), slash - kReplica.size()), i) && i >= 1;
    std::string base = ok ? name.substr(slash + 1) : "";
    ok = ok && params.contains(base) && !params[base].differentiable() && file.tensors.count(base);
    if (!ok) throw ParameterError(path + ": '" + name + "' is not replica/<i>/<name> of a state of the net (i >= 1)");
    const FileTensor& first = file.tensors.at(base);
    if (t.dtype != FileDtype::f32 || t.shape != first.shape)
      throw ParameterError(path + ": '" + name + "' has dtype " + dtype_name(t.dtype) + " and shape " + str(t.shape) +
                           ", expected F32 and " + str(first.shape) + " as '" + base + "'");
    for (auto& [n, p] : params)
      if (n == base) out.push_back({p, static_cast<size_t>(i), &t});
  }
  return out;
}

// "cpu,cpu": the kind of each device the net's parameters live on, in order (device 0's first).
std::string device_kinds(const nn::ParameterDict& params) {
  std::string out;
  for (auto& [name, p] : params) {
    for (auto& d : p->list_ctx()) out += (out.empty() ? "" : ",") + d.str().substr(0, d.str().find('('));
    break;
  }
  return out.empty() ? "cpu" : out;
}

// The "devices" entry: one known kind per device, 1 to 4096 of them. Returns the count.
size_t saved_device_count(const SafetensorsFile& file, const std::string& path) {
  auto it = file.metadata.find("devices");
  if (it == file.metadata.end()) fail(path, "checkpoint has no \"devices\" in __metadata__ (the devices it was written on)");
  size_t n = 0, start = 0;
  const std::string& s = it->second;
  for (;;) {
    size_t comma = s.find(',', start);
    std::string kind = s.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (kind != "cpu" && kind != "gpu" && kind != "emu")
      fail(path, "checkpoint's __metadata__ \"devices\" is \"" + s.substr(0, 40) + "\", expected device kinds (cpu, gpu, emu) separated by commas");
    if (++n > 4096) fail(path, "checkpoint's __metadata__ \"devices\" names more than 4096 devices");
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return n;
}

}  // namespace

void save_checkpoint(const std::string& path, const nn::Block& block, const optim::Trainer& trainer, int64_t epoch) {
  if (epoch < 0) throw ParameterError(path + ": save_checkpoint: epoch " + std::to_string(epoch) + " is negative");
  nn::ParameterDict params = block.collect_params();
  SafetensorsFile file;
  file.tensors = parameter_tensors(params);
  for (auto& [name, p] : params) {
    if (p->differentiable()) continue;
    auto replicas = p->list_data();
    for (size_t i = 1; i < replicas.size(); ++i)
      file.tensors[kReplica + std::to_string(i) + "/" + name] =
          FileTensor::from_floats(replicas[i].shape(), replicas[i].to_vector());
  }
  for (auto& [key, h] : trainer.state_dict()) file.tensors[kTrainer + key] = FileTensor::from_floats(h.shape, h.values);
  RngState rng = rng_state();
  file.metadata = {{"format", kFormat},
                   {"devices", device_kinds(params)},
                   {"epoch", std::to_string(epoch)},
                   {"rng_seed", std::to_string(rng.seed)},
                   {"rng_offset", std::to_string(rng.offset)}};
  save_safetensors(path, file);
}

int64_t load_checkpoint(const std::string& path, nn::Block& block, optim::Trainer& trainer,
                        const std::vector<Device>& devices) {
  SafetensorsFile file = load_safetensors(path);
  auto format = file.metadata.find("format");
  if (format == file.metadata.end() || format->second != kFormat)
    fail(path, "not a checkpoint (its __metadata__ has no \"format\": \"" + kFormat +
                   "\"; a parameters file loads with load_parameters)");
  uint64_t epoch = metadata_whole(file, "epoch", path);
  if (epoch > static_cast<uint64_t>(kMaxEpoch))
    fail(path, "checkpoint's epoch " + std::to_string(epoch) + " is out of range (0 to " + std::to_string(kMaxEpoch) + ")");
  const size_t saved_devices = saved_device_count(file, path);
  RngState rng{metadata_whole(file, "rng_seed", path), metadata_whole(file, "rng_offset", path)};
  nn::ParameterDict params = block.collect_params();
  auto matched = match_parameters(params, file, path);
  auto replicas = match_replicas(params, file, path);
  auto state = trainer_state(file, path);
  if (devices.empty()) throw ParameterError(path + ": load_checkpoint needs at least one device");
  // Per-device states (BatchNorm's running statistics) continue bit for bit only on as many devices;
  // on another count some would be dropped or made up, so that is refused, naming both counts.
  if (saved_devices != devices.size())
    fail(path, "checkpoint was written on " + std::to_string(saved_devices) + " device" + (saved_devices > 1 ? "s" : "") +
                   " (" + file.metadata.at("devices") + "), resuming on " + std::to_string(devices.size()) +
                   ": resume on " + std::to_string(saved_devices) + " (its per-device BatchNorm statistics), or load its parameters alone");
  {
    std::map<std::string, std::vector<bool>> seen;  // per state: which replicas 1..n-1 the file has
    for (auto& r : replicas) {
      if (r.index >= saved_devices)
        fail(path, "'replica/" + std::to_string(r.index) + "/" + r.param->name() + "' is beyond the " +
                       std::to_string(saved_devices) + " devices of its __metadata__ \"devices\"");
      auto& v = seen[r.param->name()];
      v.resize(saved_devices);
      v[r.index] = true;
    }
    for (auto& [name, p] : params) {
      if (p->differentiable()) continue;
      for (size_t i = 1; i < saved_devices; ++i)
        if (!seen.count(name) || !seen[name][i])
          fail(path, "checkpoint of " + std::to_string(saved_devices) + " devices has no 'replica/" + std::to_string(i) + "/" + name + "'");
    }
    for (auto& r : replicas) check_finite(*r.values, "replica/" + std::to_string(r.index) + "/" + r.param->name(), path);
    for (auto& [key, t] : state) {
      size_t bad = 0;
      for (float x : t.values) bad += !std::isfinite(x);
      if (bad) fail(path, "trainer state '" + kTrainer + key + "' has " + std::to_string(bad) + " of " + std::to_string(t.values.size()) +
                              " values that are not finite; refusing to resume from it");
    }
  }
  for (auto& d : devices) runtime(d);  // a backend that is not built fails here, before any change

  // Trainer::load_state_dict checks names, shapes and values before it changes anything; its
  // errors get the file's name. Only then are the parameters set.
  try {
    trainer.load_state_dict(state);
  } catch (const ParameterError& e) {
    throw ParameterError(path + ": " + e.what());
  } catch (const ShapeError& e) {
    throw ShapeError(path + ": " + e.what());
  } catch (const ConfigError& e) {
    throw ConfigError(path + ": " + e.what());
  }
  assign_parameters(matched, devices);
  // The other devices' states (as many devices as when saved: checked above).
  for (auto& r : replicas)
    Tensor::from_vector(r.values->floats(), r.values->shape, devices[r.index]).copyto(r.param->data(devices[r.index]));
  set_rng_state(rng);
  return static_cast<int64_t>(epoch);
}

}  // namespace d2l::io
