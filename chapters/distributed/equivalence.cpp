// Equivalence: the processes of mpirun with k devices each train exactly what one process with
// N*k devices trains. Both runs are chapter 2's train() on the same generated images: the
// distributed one with kvstore dist_sync and DDP's buckets (each rank reads its devices' shards of
// every minibatch), the reference with kvstore device on cpu(0) .. cpu(N*k - 1) of this process
// alone (every rank trains it; no collectives). BatchNorm normalises per device in both, over the
// same shards. Printed: the largest difference of any parameter after the steps.
#include <algorithm>
#include <cmath>

#include "chapters/distributed/distributed.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/dist/process_group.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::distributed {

namespace {

concise::Config small(const Config& cfg, std::vector<Device> devices, const std::string& kvstore) {
  concise::Config c;
  c.devices = std::move(devices);
  c.model = "resnet18";
  const int64_t batch = 8 * static_cast<int64_t>(cfg.devices.size()) * dist::world_size();
  c.train_data = make_image_classification(batch * cfg.equivalence_steps, 12, 10, cfg.seed + 21);
  c.test_data = make_image_classification(16, 12, 10, cfg.seed + 22);
  c.batch_size = batch;
  c.lr = 0.1f;
  c.num_epochs = 1;
  c.seed = cfg.seed;
  c.kvstore = kvstore;
  c.bucket_mb = cfg.bucket_mb;
  c.comm_type = cfg.comm_type;  // the reference (kvstore device) has no buckets: it sums in float32
  c.verbose = false;
  c.autocast = cfg.autocast;  // both runs under the same autocast (and fp16's loss scaling)
  return c;
}

}  // namespace

std::pair<double, double> equivalence(const Config& cfg) {
  auto distributed = concise::trained_values(concise::train(small(cfg, cfg.devices, "dist_sync")));
  std::vector<Device> all;
  for (int i = 0; i < static_cast<int>(cfg.devices.size()) * dist::world_size(); ++i) all.push_back(cpu(i));
  use_devices(all);
  auto alone = concise::trained_values(concise::train(small(cfg, all, "device")));
  use_devices(cfg.devices);
  double diff = 0, scale = 0;
  for (size_t t = 0; t < alone.size(); ++t)
    for (size_t i = 0; i < alone[t].size(); ++i) {
      diff = std::max(diff, static_cast<double>(std::fabs(distributed[t][i] - alone[t][i])));
      scale = std::max(scale, static_cast<double>(std::fabs(alone[t][i])));
    }
  return {diff, scale};
}

}  // namespace d2l::distributed
