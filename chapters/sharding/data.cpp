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

void validate(const Config& cfg) {
  if (cfg.zero_stage < 0 || cfg.zero_stage > 3)
    throw ConfigError("bad --zero-stage " + std::to_string(cfg.zero_stage) +
                      ": expected 0 (replicated), 1 (ZeRO-1), 2 (ZeRO-2) or 3 (ZeRO-3, FSDP)");
  const auto n = static_cast<int64_t>(cfg.devices.size());
  if (cfg.batch_size < n)
    throw ConfigError("bad --batch-size " + std::to_string(cfg.batch_size) + ": smaller than the " + std::to_string(n) +
                      " devices, and every device needs at least one example");
  if (cfg.tp_size < 1 || cfg.tp_size > n)
    throw ConfigError("bad --tp-size " + std::to_string(cfg.tp_size) + ": expected 1 to the " + std::to_string(n) +
                      " devices given (" + str(cfg.devices) + ")");
  if (cfg.hidden % cfg.tp_size != 0)
    throw ConfigError("bad --tp-size " + std::to_string(cfg.tp_size) + ": the hidden size " + std::to_string(cfg.hidden) +
                      " (--hidden) cannot be split evenly over " + std::to_string(cfg.tp_size) + " devices");
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
