// DataIter: batching with a partial last batch, every example once per epoch, seeded shuffles,
// bad arguments; load_data_fashion_mnist on generated IDX files and on the real data set.
#include <doctest/doctest.h>

#include <filesystem>
#include <stdexcept>
#include <string>

#include "datasets/data_iter.hpp"
#include "datasets/idx_write.hpp"

namespace {

// n examples of shape (2, 3); every value of example i is 100 * i + position, label i % 7.
d2l::ArrayDataset make_data(int64_t n) {
  d2l::ArrayDataset d;
  d.n = n;
  d.feature_shape = {2, 3};
  for (int64_t i = 0; i < n; ++i) {
    for (int p = 0; p < 6; ++p) d.features.push_back(static_cast<float>(100 * i + p));
    d.labels.push_back(static_cast<int32_t>(i % 7));
  }
  return d;
}

// The example indices a pass visits, read back from the features, checking labels agree.
std::vector<int64_t> visited(const d2l::DataIter& it, int64_t epoch) {
  std::vector<int64_t> out;
  for (const d2l::Batch& b : it.epoch(epoch)) {
    for (int64_t k = 0; k < b.n; ++k) {
      int64_t i = static_cast<int64_t>(b.X[k * 6]) / 100;
      CHECK(b.y[k] == i % 7);
      CHECK(b.X[k * 6 + 5] == static_cast<float>(100 * i + 5));
      out.push_back(i);
    }
  }
  return out;
}

}  // namespace

TEST_CASE("batches keep the last partial batch, in file order without shuffling") {
  d2l::DataIter it(make_data(10), 4, false);
  CHECK(it.num_batches() == 3);
  CHECK(it.size() == 10);
  std::vector<int64_t> sizes;
  for (const d2l::Batch& b : it.epoch(0)) {
    sizes.push_back(b.n);
    CHECK(b.shape == std::vector<int64_t>{b.n, 2, 3});
    CHECK(b.X.size() == size_t(b.n) * 6);
    CHECK(b.y.size() == size_t(b.n));
  }
  CHECK(sizes == std::vector<int64_t>{4, 4, 2});
  CHECK(visited(it, 0) == std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  CHECK(visited(it, 3) == visited(it, 0));  // no shuffle: every epoch the same
}

TEST_CASE("every example exactly once per shuffled epoch") {
  d2l::DataIter it(make_data(23), 5, true, 42);
  CHECK(it.num_batches() == 5);
  for (int64_t e = 0; e < 4; ++e) {
    std::vector<int64_t> seen = visited(it, e);
    REQUIRE(seen.size() == 23);
    std::vector<int> count(23, 0);
    for (int64_t i : seen) ++count.at(i);
    for (int c : count) CHECK(c == 1);
  }
}

TEST_CASE("seeded shuffles are reproducible and differ across seeds and epochs") {
  d2l::DataIter a(make_data(50), 8, true, 7), b(make_data(50), 8, true, 7), c(make_data(50), 8, true, 8);
  CHECK(a.order(0) == b.order(0));
  CHECK(a.order(5) == b.order(5));
  CHECK(a.order(0) != c.order(0));
  CHECK(a.order(0) != a.order(1));
  CHECK(visited(a, 2) == std::vector<int64_t>(a.order(2)));
  // Range-for over the iterator itself starts epoch 0, then 1, ... as the book's loops do.
  for (int64_t e = 0; e < 3; ++e) {
    std::vector<int32_t> ys, want;
    for (const d2l::Batch& bt : a) ys.insert(ys.end(), bt.y.begin(), bt.y.end());
    for (int64_t i : a.order(e)) want.push_back(static_cast<int32_t>(i % 7));
    CHECK(ys == want);
  }
}

TEST_CASE("bad batch size and inconsistent data are one-line errors") {
  for (int64_t bs : {0, -3}) {
    try {
      d2l::DataIter it(make_data(4), bs, false);
      FAIL("no exception for batch_size ", bs);
    } catch (const std::invalid_argument& e) {
      std::string msg = e.what();
      CHECK(msg == "batch_size " + std::to_string(bs) + " is invalid; expected >= 1");
    }
  }
  CHECK_THROWS_AS(d2l::load_data_fashion_mnist(0, "/nonexistent"), std::invalid_argument);
  d2l::ArrayDataset bad = make_data(4);
  bad.labels.pop_back();
  CHECK_THROWS_WITH_AS(d2l::DataIter(bad, 2, false), doctest::Contains("expected n * 6 values and n labels"),
                       std::invalid_argument);
  d2l::DataIter empty(make_data(0), 3, true);
  CHECK(empty.num_batches() == 0);
  for (const d2l::Batch& b : empty) FAIL("a batch from an empty data set: ", b.n);
}

TEST_CASE("load_data_fashion_mnist on generated IDX files: train shuffled, test in order") {
  d2l::idx_write::TempDir dir;
  d2l::idx_write::write_split(dir.str(), "train", 30, 4, 5, true);
  d2l::idx_write::write_split(dir.str(), "t10k", 11, 4, 5, false);
  auto [train_iter, test_iter] = d2l::load_data_fashion_mnist(8, dir.str(), 3);
  CHECK(train_iter.num_batches() == 4);
  CHECK(test_iter.num_batches() == 2);
  std::vector<int64_t> in_order(11);
  for (int64_t i = 0; i < 11; ++i) in_order[i] = i;
  CHECK(test_iter.order(0) == in_order);
  CHECK(train_iter.order(0) != std::vector<int64_t>(train_iter.order(1)));
  d2l::Batch b = test_iter.batch(test_iter.order(0), 1);
  CHECK(b.n == 3);
  CHECK(b.shape == std::vector<int64_t>{3, 1, 4, 5});
  CHECK(b.y[0] == d2l::idx_write::label(8));
  CHECK(b.X[0] == doctest::Approx(d2l::idx_write::pixel(8 * 20) / 255.0).epsilon(1e-6));
}

// Skipped (reported as such) without Debian's dataset-fashion-mnist.
TEST_CASE("load_data_fashion_mnist on the real data set" * doctest::skip(!std::filesystem::is_directory(d2l::kFashionMnistDebianDir))) {
  auto [train_iter, test_iter] = d2l::load_data_fashion_mnist(256, d2l::kFashionMnistDebianDir);
  CHECK(train_iter.num_batches() == 235);  // 234 full batches + 96 examples
  CHECK(test_iter.num_batches() == 40);
  std::vector<int64_t> order = train_iter.order(0);
  d2l::Batch first = train_iter.batch(order, 0), last = train_iter.batch(order, 234);
  CHECK(first.shape == std::vector<int64_t>{256, 1, 28, 28});
  CHECK(last.shape == std::vector<int64_t>{96, 1, 28, 28});
}
