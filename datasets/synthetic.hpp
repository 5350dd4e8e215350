// Generated classification data with real structure, for tests and the smoke program: 10 classes
// (by default), each a Gaussian cloud around its own centre in feature space, pushed through a fixed
// nonlinearity so a linear model is not enough. Deterministic for a seed.
#pragma once
#include <cstdint>

#include "datasets/data_iter.hpp"

namespace d2l {

struct SyntheticSpec {
  int64_t n = 4000;           // examples
  int64_t features = 20;      // feature_shape = (features)
  int64_t classes = 10;
  float spread = 2.5f;        // noise around each centre (centres are N(0, 1) * 2.5)
  uint64_t seed = 0;          // the centres: train and test sets share it
  uint64_t sample_seed = 1;   // the samples: differ between train and test
};

ArrayDataset make_classification(const SyntheticSpec& spec);

// The same structure as images (n, 1, side, side), for convolutional tests: class k has a bright
// blob at its own place, plus noise.
ArrayDataset make_image_classification(int64_t n, int64_t side, int64_t classes, uint64_t seed);

}  // namespace d2l
