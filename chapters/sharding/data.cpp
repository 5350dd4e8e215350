// The data of both parts, and the flags checked against each other before any work.
#include <string>

#include "chapters/sharding/sharding.hpp"
#include "core/cli.hpp"
#include "datasets/fashion_mnist.hpp"
#include "datasets/idx.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::sharding {

void make_quick(Config& cfg) {
  cfg.train_data = make_image_classification(1024, 28, 10, cfg.seed + 1);
  cfg.test_data = make_image_classification(256, 28, 10, cfg.seed + 2);
  cfg.batch_size = 64;
  cfg.steps = 10;
  cfg.num_epochs = 2;
  cfg.zero_hidden = 256;  // 8 layers of 256: Psi = 0.66 M, the ladder still clear
}

void validate_memory(const Config& cfg, int processes) {
  if (cfg.zero_stage < 0 || cfg.zero_stage > 3)
    throw ConfigError("bad --zero-stage " + std::to_string(cfg.zero_stage) +
                      ": expected 0 (replicated), 1 (ZeRO-1), 2 (ZeRO-2) or 3 (ZeRO-3, FSDP)");
  // Over the ranks with one device each every rank takes its rows of each minibatch, as many as there
  // are; with several devices a rank (the hybrid runs) every device of every rank needs an example.
  const auto k = static_cast<int64_t>(cfg.devices.size());
  if (processes > 1 && k == 1) return;
  const int64_t n = processes * k;
  if (cfg.batch_size < n)
    throw ConfigError("bad --batch-size " + std::to_string(cfg.batch_size) + ": smaller than the " + std::to_string(n) +
                      " devices part 1 splits it over" +
                      (processes > 1 ? " (" + std::to_string(processes) + " processes x " + std::to_string(k) +
                                           " devices in its hybrid runs; --num-gpus 1 runs one device a process)"
                                     : std::string()) +
                      ", and every device needs at least one example");
  if (processes > 1) return;
  // The bytes sent are checked against formulas for devices of one kind: a mix of kinds sends other counts.
  for (const Device& d : cfg.devices)
    if (d.kind != cfg.devices[0].kind)
      throw ConfigError("bad --devices " + str(cfg.devices) + ": part 1 compares the bytes devices of one kind send, got " +
                        d.str() + " beside " + cfg.devices[0].str());
  if (!cfg.trace_file.empty() && cfg.zero_stage != 3)
    throw ConfigError("bad --trace " + cfg.trace_file + ": as one process it traces a ZeRO-3 step, and --zero-stage " +
                      std::to_string(cfg.zero_stage) + " runs none");
}

void validate_tp(const Config& cfg) {
  const auto n = static_cast<int64_t>(cfg.devices.size());
  if (cfg.tp_size < 1 || cfg.tp_size > n)
    throw ConfigError("bad --tp-size " + std::to_string(cfg.tp_size) + ": expected 1 to the " + std::to_string(n) +
                      " devices given (" + str(cfg.devices) + ")");
  if (cfg.hidden % cfg.tp_size != 0)
    throw ConfigError("bad --tp-size " + std::to_string(cfg.tp_size) + ": the hidden size " + std::to_string(cfg.hidden) +
                      " (--hidden) cannot be split evenly over " + std::to_string(cfg.tp_size) + " devices");
}

void validate(const Config& cfg) {
  validate_memory(cfg, 1);
  validate_tp(cfg);
}

void validate_short_batch(const Config& cfg, int processes) {
  const int64_t n = cfg.train_data->n, b = cfg.batch_size, last = n % b, devices = processes * static_cast<int64_t>(cfg.devices.size());
  // Steps 0 to --steps run through the epochs' minibatches in turn; the short one is the (n / b + 1)-th.
  if (last == 0 || last >= devices || static_cast<int64_t>(cfg.steps) + 1 <= n / b) return;
  throw ConfigError("bad --batch-size " + std::to_string(b) + ": the " + std::to_string(n) +
                    " training examples leave a last minibatch of " + std::to_string(last) + ", fewer than the " +
                    std::to_string(devices) + " devices part 1 splits it over, at step " + std::to_string(n / b + 1) + " of " +
                    std::to_string(cfg.steps + 1) + " (a warm-up and --steps " + std::to_string(cfg.steps) +
                    "); choose a size that leaves none or at least " + std::to_string(devices));
}

double classifier_bytes(const Config& cfg, int64_t features, int processes, bool grid) {
  const double f = double(features), d = double(cfg.d_model), h = double(cfg.hidden), p = double(cfg.tp_size);
  const double outer = f * d + d + 10 * d + 10, mlp = 2 * d * h + h + d;  // embed and out; fc1 and fc2
  // Parameters and gradients: part 2, the unsharded net and the sharded one (its outer layers on every
  // device of the group); the grid, on every process, the unsharded net and its share of it.
  const double weights = grid ? processes * 2 * (2 * outer + mlp + mlp / p) : 2 * (2 * outer + 2 * mlp + (p - 1) * outer);
  // A minibatch's input and activations, forward and backward, on every device (process) that holds one.
  const double activations = (grid ? 2 * processes : p + 1) * double(cfg.batch_size) * (f + 2 * (2 * d + h + 10));
  return 4 * (weights + activations);
}

void load_data(Config& cfg) {
  for (bool train : {true, false}) {
    std::optional<ArrayDataset>& d = train ? cfg.train_data : cfg.test_data;
    // gb.load_data_fashion_mnist(batch_size): 28x28 images, pixels / 255 (unless generated, --quick)
    try {
      if (!d) d = to_array_dataset(load_split(cfg.data_dir, train));
    } catch (const DataError& e) {  // a missing or malformed data set is bad input: exit 2
      throw ConfigError(e.what());
    }
    if (d->n == 0)  // an epoch of no minibatches would "train" and report nonsense
      throw ConfigError(std::string("the ") + (train ? "training" : "test") + " set in '" +
                        resolve_data_dir(cfg.data_dir).path + "' has no examples");
  }
}

}  // namespace d2l::sharding
