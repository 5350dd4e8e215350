#include "chapters/distributed/distributed.hpp"

namespace d2l::distributed {

void make_quick(Config& cfg) {
  cfg.sizes = {4e3, 64e3, 1e6};
  cfg.seconds_per_point = 0.02;
  cfg.batch = 4;
  cfg.image = 12;
  cfg.warmup = 2;
  cfg.repeats = 2;
  cfg.bucket_mbs = {1, 25};
  cfg.link = {8.0, 500};
  cfg.measure_without_model = false;
  cfg.equivalence_steps = 2;
}

}  // namespace d2l::distributed
