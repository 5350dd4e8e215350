#include "datasets/synthetic.hpp"

#include <cmath>
#include <random>
#include <stdexcept>

namespace d2l {

ArrayDataset make_classification(const SyntheticSpec& s) {
  if (s.n < 0 || s.features < 1 || s.classes < 2) throw std::invalid_argument("make_classification: bad spec");
  std::mt19937_64 centre_rng(s.seed), rng(s.sample_seed * 7919 + 17);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::vector<float> centres(static_cast<size_t>(s.classes * s.features));
  for (auto& c : centres) c = 2.5f * gauss(centre_rng);
  ArrayDataset d;
  d.n = s.n;
  d.feature_shape = {s.features};
  d.features.resize(static_cast<size_t>(s.n * s.features));
  d.labels.resize(static_cast<size_t>(s.n));
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(s.classes - 1));
  for (int64_t i = 0; i < s.n; ++i) {
    int32_t k = pick(rng);
    d.labels[i] = k;
    for (int64_t j = 0; j < s.features; ++j) {
      float v = centres[k * s.features + j] + s.spread * gauss(rng);
      d.features[i * s.features + j] = std::tanh(0.5f * v) * 2.0f;  // bend the clouds: nonlinear, bounded
    }
  }
  return d;
}

ArrayDataset make_image_classification(int64_t n, int64_t side, int64_t classes, uint64_t seed) {
  if (n < 0 || side < 4 || classes < 2) throw std::invalid_argument("make_image_classification: bad spec");
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> noise(0.0f, 0.3f);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(classes - 1));
  ArrayDataset d;
  d.n = n;
  d.feature_shape = {1, side, side};
  d.features.resize(static_cast<size_t>(n * side * side));
  d.labels.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    int32_t k = pick(rng);
    d.labels[i] = k;
    // Class k's blob centre goes around a circle.
    double angle = 2 * M_PI * k / classes;
    double cy = side / 2.0 + side / 3.0 * std::sin(angle), cx = side / 2.0 + side / 3.0 * std::cos(angle);
    for (int64_t y = 0; y < side; ++y)
      for (int64_t x = 0; x < side; ++x) {
        double r2 = (y - cy) * (y - cy) + (x - cx) * (x - cx);
        float v = static_cast<float>(std::exp(-r2 / (side * side / 15.0))) + noise(rng);
        d.features[(i * side + y) * side + x] = std::min(1.0f, v);
      }
  }
  return d;
}

}  // namespace d2l
