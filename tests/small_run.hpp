// The chapters' tests train short, quiet runs on generated images (datasets/synthetic.hpp): a
// chapter's Config (concise::Config, scratch::Config: the fields they share) for such a run.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/device.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::test {

// `train` and `test` generated images of size x size pixels in 10 classes as c's data: the training
// images from data_seed, the test images from data_seed + 1.
template <class Config>
void generated_images(Config& c, int64_t train, int64_t test, int64_t size, uint64_t data_seed) {
  c.train_data = make_image_classification(train, size, 10, data_seed);
  c.test_data = make_image_classification(test, size, 10, data_seed + 1);
}

struct SmallRun {
  int64_t train_images, test_images, image_size;
  uint64_t data_seed;  // the training images'; the test images' is the next
  int64_t batch_size;
  float lr;
  uint64_t seed;  // the initial parameters and the shuffling
  int num_epochs = 1;
};

// The run `r` on `devices`, quiet; every other field as the Config's default.
template <class Config>
Config small_run(std::vector<Device> devices, const SmallRun& r) {
  Config c;
  c.devices = std::move(devices);
  generated_images(c, r.train_images, r.test_images, r.image_size, r.data_seed);
  c.batch_size = r.batch_size;
  c.lr = r.lr;
  c.num_epochs = r.num_epochs;
  c.verbose = false;
  c.seed = r.seed;
  return c;
}

}  // namespace d2l::test
