// split_and_load (Gluon's semantics): even and uneven shards on the right devices with the right
// rows, the even_split error, host batches, weighted shard sizes against an independent
// largest-remainder reference, and probe_weights with a fake timer.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "check.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "datasets/data_iter.hpp"

using namespace d2l;
using namespace d2l::nn;

namespace {

// Rows 0..n-1 of width w: row r holds r*100 + column, so each shard's rows can be read back.
std::vector<float> rows_data(int64_t n, int64_t w) {
  std::vector<float> v;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < w; ++c) v.push_back(static_cast<float>(r * 100 + c));
  return v;
}

// Shards hold consecutive rows of rows_data, with the given sizes, on the given devices.
void check_shards(const std::vector<Tensor>& shards, const std::vector<int64_t>& sizes,
                  const std::vector<Device>& devices, int64_t w) {
  REQUIRE(shards.size() == sizes.size());
  int64_t row = 0;
  for (size_t i = 0; i < shards.size(); ++i) {
    CHECK(shards[i].device() == devices[i]);
    CHECK(shards[i].shape() == Shape{sizes[i], w});
    auto got = shards[i].to_vector();
    auto want = rows_data(row + sizes[i], w);
    want.erase(want.begin(), want.begin() + row * w);
    CHECK(got == want);
    row += sizes[i];
  }
}

// Largest remainder, written independently: sort (fraction, -index) pairs descending.
std::vector<int64_t> hamilton(int64_t n, const std::vector<double>& w) {
  long double total = 0;
  for (double x : w) total += x;
  std::vector<int64_t> s(w.size());
  std::vector<std::pair<long double, int>> rest;
  int64_t given = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    long double q = n * static_cast<long double>(w[i]) / total;
    s[i] = static_cast<int64_t>(std::floor(q));
    given += s[i];
    rest.push_back({q - std::floor(q), -static_cast<int>(i)});
  }
  std::sort(rest.rbegin(), rest.rend());
  for (size_t j = 0; given < n; ++j, ++given) ++s[static_cast<size_t>(-rest[j].second)];
  return s;
}

}  // namespace

TEST_CASE("even split: one equal shard per device, rows in order") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  Tensor x = Tensor::from_vector(rows_data(6, 3), {6, 3}, cpu(0));
  check_shards(split_and_load(x, devs), {3, 3}, devs, 3);
  // One device: the tensor itself, as Gluon's as_in_context.
  auto one = split_and_load(x, {cpu(0)});
  REQUIRE(one.size() == 1);
  CHECK(one[0].same(x));
  check_shards(split_and_load(x, {cpu(1)}), {6}, {cpu(1)}, 3);
}

TEST_CASE("uneven split: shards differ by one, the first ones larger; fewer rows than devices") {
  const std::vector<Device> devs{cpu(0), cpu(1), cpu(2)};
  Tensor x = Tensor::from_vector(rows_data(10, 2), {10, 2}, cpu(1));
  check_shards(split_and_load(x, devs, false), {4, 3, 3}, devs, 2);
  Tensor small = Tensor::from_vector(rows_data(2, 2), {2, 2}, cpu(0));
  check_shards(split_and_load(small, devs, false), {1, 1}, devs, 2);
  CHECK(even_shard_sizes(11, 4, false) == std::vector<int64_t>{3, 3, 3, 2});
  // int32 labels split the same way.
  Tensor y = Tensor::from_vector(std::vector<int32_t>{0, 1, 2, 3, 4}, {5}, cpu(0));
  auto ys = split_and_load(y, {cpu(0), cpu(1)}, false);
  REQUIRE(ys.size() == 2);
  CHECK(ys[0].to_labels() == std::vector<int32_t>{0, 1, 2});
  CHECK(ys[1].to_labels() == std::vector<int32_t>{3, 4});
  CHECK(ys[1].dtype() == DType::i32);
}

TEST_CASE("even_split with a batch that does not divide: one line naming the batch and the devices") {
  Tensor x = Tensor::from_vector(rows_data(10, 2), {10, 2}, cpu(0));
  CHECK_THROWS_WITH_AS(split_and_load(x, {cpu(0), cpu(1), cpu(2)}),
                       "split_and_load: a batch of 10 cannot be split evenly over 3 devices; use a batch size "
                       "that is a multiple of 3 or even_split=false",
                       ShapeError);
  CHECK_THROWS_AS(split_and_load(x, {}), ConfigError);
  CHECK_THROWS_AS(split_and_load(Tensor::from_vector(std::vector<float>{1}, {1}, cpu(0)).detach(), {cpu(0), cpu(1)}),
                  ShapeError);
}

TEST_CASE("a host Batch: X and y shards with matching rows") {
  Batch b;
  b.n = 5;
  b.shape = {5, 1, 2, 2};
  b.X = rows_data(5, 4);
  b.y = {10, 11, 12, 13, 14};
  const std::vector<Device> devs{cpu(0), cpu(1)};
  auto [X, y] = split_and_load(b, devs, false);
  REQUIRE(X.size() == 2);
  REQUIRE(y.size() == 2);
  CHECK(X[0].shape() == Shape{3, 1, 2, 2});
  CHECK(X[1].shape() == Shape{2, 1, 2, 2});
  CHECK(X[1].device() == cpu(1));
  CHECK(y[1].device() == cpu(1));
  CHECK(X[1].to_vector() == std::vector<float>{300, 301, 302, 303, 400, 401, 402, 403});
  CHECK(y[0].to_labels() == std::vector<int32_t>{10, 11, 12});
  CHECK(y[1].to_labels() == std::vector<int32_t>{13, 14});
  CHECK_THROWS_AS(split_and_load(b, devs), ShapeError);  // 5 over 2, even_split
  b.y.pop_back();
  CHECK_THROWS_AS(split_and_load(b, devs, false), ShapeError);
  // The host-vector form.
  auto hx = split_and_load(rows_data(4, 3), {4, 3}, devs);
  check_shards(hx, {2, 2}, devs, 3);
  CHECK_THROWS_AS(split_and_load(rows_data(4, 3), {4, 2}, devs), ShapeError);
}

TEST_CASE("shard_sizes: sums to n, never negative, never empty while n >= devices, largest remainder") {
  CHECK(shard_sizes(10, {3, 1}) == std::vector<int64_t>{8, 2});  // 7.5 / 2.5: the tie goes to the first
  CHECK(shard_sizes(12, {3, 1}) == std::vector<int64_t>{9, 3});
  CHECK(shard_sizes(10, {1, 1, 1}) == std::vector<int64_t>{4, 3, 3});
  CHECK(shard_sizes(3, {100, 1, 1}) == std::vector<int64_t>{1, 1, 1});  // no empty shard
  CHECK(shard_sizes(2, {1, 1, 1}) == std::vector<int64_t>{1, 1, 0});    // fewer rows than devices
  CHECK(shard_sizes(0, {1, 2}) == std::vector<int64_t>{0, 0});

  uint32_t seed = 7;
  for (int trial = 0; trial < 500; ++trial) {
    const size_t k = 1 + trial % 5;
    auto r = test::lcg_data(static_cast<int64_t>(k) + 1, seed++);
    std::vector<double> w;
    for (size_t i = 0; i < k; ++i) w.push_back(0.05 + std::fabs(r[i]) * (trial % 3 == 0 ? 20.0 : 1.0));
    const int64_t n = static_cast<int64_t>(std::fabs(r[k]) * 200);
    auto s = shard_sizes(n, w);
    REQUIRE(s.size() == k);
    CHECK(std::accumulate(s.begin(), s.end(), int64_t{0}) == n);
    CHECK(std::all_of(s.begin(), s.end(), [](int64_t x) { return x >= 0; }));
    if (n >= static_cast<int64_t>(k)) CHECK(std::all_of(s.begin(), s.end(), [](int64_t x) { return x >= 1; }));
    auto ref = hamilton(n, w);
    const bool ref_has_empty = std::count(ref.begin(), ref.end(), 0) > 0;
    if (!ref_has_empty || n < static_cast<int64_t>(k)) {
      CHECK(s == ref);
      const double total = std::accumulate(w.begin(), w.end(), 0.0);
      for (size_t i = 0; i < k; ++i) CHECK(std::fabs(static_cast<double>(s[i]) - n * w[i] / total) < 1.0);
    }
  }
  CHECK_THROWS_AS(shard_sizes(4, {}), ConfigError);
  CHECK_THROWS_WITH_AS(shard_sizes(4, {1, -1}), "shard_sizes: weight 1 is -1; weights must be positive and finite",
                       ConfigError);
  CHECK_THROWS_AS(shard_sizes(4, {1, NAN}), ConfigError);
}

TEST_CASE("weighted split_and_load puts the proportional rows on each device") {
  const std::vector<Device> devs{cpu(0), cpu(1)};
  Tensor x = Tensor::from_vector(rows_data(8, 2), {8, 2}, cpu(0));
  check_shards(split_and_load(x, devs, std::vector<double>{0.75, 0.25}), {6, 2}, devs, 2);
  Batch b;
  b.n = 4;
  b.shape = {4, 2};
  b.X = rows_data(4, 2);
  b.y = {0, 1, 2, 3};
  auto [X, y] = split_and_load(b, devs, std::vector<double>{1, 3});
  check_shards(X, {1, 3}, devs, 2);
  CHECK(y[1].to_labels() == std::vector<int32_t>{1, 2, 3});
  CHECK_THROWS_AS(split_and_load(x, devs, std::vector<double>{1, 2, 3}), ConfigError);
}

TEST_CASE("probe_weights with a fake timer: a device 3x slower gets a quarter of the weight") {
  double clock = 0;
  std::vector<Device> probed;
  auto step = [&](Device d) {
    probed.push_back(d);
    clock += d == cpu(1) ? 3.0 : 1.0;  // cpu(1) takes three times as long
  };
  auto w = probe_weights({cpu(0), cpu(1)}, step, [&] { return clock; }, 2);
  REQUIRE(w.size() == 2);
  CHECK(w[0] == doctest::Approx(0.75).epsilon(1e-12));
  CHECK(w[1] == doctest::Approx(0.25).epsilon(1e-12));
  // Each device alone: one warm-up and two timed calls, in device order.
  CHECK(probed == std::vector<Device>{cpu(0), cpu(0), cpu(0), cpu(1), cpu(1), cpu(1)});
  CHECK(shard_sizes(64, w) == std::vector<int64_t>{48, 16});
  CHECK_THROWS_AS(probe_weights({cpu(0)}, [](Device) {}, [] { return 1.0; }), ConfigError);
  CHECK_THROWS_AS(probe_weights({}, step, [&] { return clock; }), ConfigError);
}

TEST_CASE("probe_weights with the wall clock on real work") {
  auto step = [](Device d) {
    Tensor a = Tensor::ones({64, 64}, d);
    for (int i = 0; i < 4; ++i) a = matmul(a, a) * (1.0f / 64);
    a.to_vector();
  };
  auto w = probe_weights({cpu(0), cpu(1)}, step);
  REQUIRE(w.size() == 2);
  CHECK(w[0] > 0);
  CHECK(w[1] > 0);
  CHECK(w[0] + w[1] == doctest::Approx(1.0));
}

TEST_CASE("a tensor that needs a gradient gets differentiable shards") {
  Tensor x = Tensor::from_vector(rows_data(4, 2), {4, 2}, cpu(0));
  x.attach_grad();
  auto xs = split_and_load(x, {cpu(0), cpu(1)});
  CHECK(xs[1].device() == cpu(1));
  sum(xs[0] * 2.0f).backward();
  sum(xs[1] * 3.0f).backward();
  CHECK(x.grad().to_vector() == std::vector<float>{2, 2, 2, 2, 3, 3, 3, 3});
}

TEST_CASE("shards onto emulated GPUs") {
  const std::vector<Device> devs{emu(0), emu(1)};
  Tensor x = Tensor::from_vector(rows_data(5, 2), {5, 2}, cpu(0));
  check_shards(split_and_load(x, devs, false), {3, 2}, devs, 2);
  auto back = split_and_load(split_and_load(x, devs, false)[1], {cpu(0), cpu(1)});
  REQUIRE(back.size() == 2);
  CHECK(back[1].device() == cpu(1));
  CHECK(back[0].to_vector() == std::vector<float>{300, 301});
  CHECK(back[1].to_vector() == std::vector<float>{400, 401});
}
