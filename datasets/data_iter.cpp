// DataIter: seeded shuffles and batch gathering over examples in host memory.
#include "datasets/data_iter.hpp"

#include <algorithm>
#include <random>
#include <stdexcept>
#include <string>

namespace d2l {

ArrayDataset to_array_dataset(Dataset d) {
  ArrayDataset a;
  a.n = d.n;
  a.feature_shape = {1, d.rows, d.cols};
  a.features = std::move(d.images);
  a.labels = std::move(d.labels);
  return a;
}

DataIter::DataIter(ArrayDataset data, int64_t batch_size, bool shuffle, uint64_t seed)
    : batch_size_(batch_size), shuffle_(shuffle), seed_(seed) {
  if (batch_size <= 0)
    throw std::invalid_argument("batch_size " + std::to_string(batch_size) + " is invalid; expected >= 1");
  int64_t per = 1;
  for (int64_t s : data.feature_shape) per *= s;
  if (data.n < 0 || static_cast<int64_t>(data.labels.size()) != data.n ||
      static_cast<int64_t>(data.features.size()) != data.n * per)
    throw std::invalid_argument("ArrayDataset: n " + std::to_string(data.n) + " with " +
                                std::to_string(data.features.size()) + " feature values and " +
                                std::to_string(data.labels.size()) + " labels; expected n * " +
                                std::to_string(per) + " values and n labels");
  data_ = std::make_shared<const ArrayDataset>(std::move(data));
}

DataIter::DataIter(Dataset data, int64_t batch_size, bool shuffle, uint64_t seed)
    : DataIter(to_array_dataset(std::move(data)), batch_size, shuffle, seed) {}

std::vector<int64_t> DataIter::order(int64_t epoch) const {
  std::vector<int64_t> idx(static_cast<size_t>(size()));
  for (int64_t i = 0; i < size(); ++i) idx[i] = i;
  if (!shuffle_) return idx;
  // Fisher-Yates with mt19937_64 (its output is fixed by the standard, unlike std::shuffle's use of
  // it), so the same seed gives the same order with every compiler. The modulo bias is below
  // n / 2^64, far too small to matter.
  std::mt19937_64 rng(seed_ + static_cast<uint64_t>(epoch));
  for (int64_t i = size() - 1; i > 0; --i) {
    int64_t j = static_cast<int64_t>(rng() % static_cast<uint64_t>(i + 1));
    std::swap(idx[i], idx[j]);
  }
  return idx;
}

Batch DataIter::batch(const std::vector<int64_t>& order, int64_t i) const {
  if (i < 0 || i >= num_batches() || static_cast<int64_t>(order.size()) != size())
    throw std::out_of_range("DataIter::batch: batch " + std::to_string(i) + " of " +
                            std::to_string(num_batches()) + " requested with an order of " +
                            std::to_string(order.size()) + " examples; expected 0 <= i < num_batches()");
  const ArrayDataset& d = *data_;
  int64_t per = 1;
  for (int64_t s : d.feature_shape) per *= s;
  Batch b;
  int64_t start = i * batch_size_;
  b.global_n = std::min(batch_size_, size() - start);
  // This process's shards [first_, last_) of the minibatch: shard p starts at p*q + min(p, rem).
  const int64_t q = b.global_n / parts_, rem = b.global_n % parts_;
  const int64_t row0 = first_ * q + std::min(first_, rem), row1 = last_ * q + std::min(last_, rem);
  start += row0;
  b.n = row1 - row0;
  b.shape = {b.n};
  b.shape.insert(b.shape.end(), d.feature_shape.begin(), d.feature_shape.end());
  b.X.resize(static_cast<size_t>(b.n * per));
  b.y.resize(static_cast<size_t>(b.n));
  for (int64_t k = 0; k < b.n; ++k) {
    int64_t src = order[start + k];
    std::copy_n(d.features.begin() + src * per, per, b.X.begin() + k * per);
    b.y[k] = d.labels[src];
  }
  return b;
}

void DataIter::shard(int64_t parts, int64_t first, int64_t last) {
  if (parts < 1 || first < 0 || first >= last || last > parts)
    throw std::invalid_argument("DataIter::shard: shards [" + std::to_string(first) + ", " + std::to_string(last) +
                                ") of " + std::to_string(parts) + " do not make sense");
  parts_ = parts, first_ = first, last_ = last;
}

DataIter::Epoch DataIter::epoch(int64_t e) const { return Epoch(this, e); }

DataIter::Iterator DataIter::begin() { return epoch(next_epoch_++).begin(); }

DataIter::Iterator DataIter::end() { return Iterator(this, nullptr, num_batches()); }

DataIter::Iterator::Iterator(const DataIter* it, std::shared_ptr<const std::vector<int64_t>> order, int64_t i)
    : it_(it), order_(std::move(order)), i_(i) {
  if (order_ && i_ < it_->num_batches()) batch_ = it_->batch(*order_, i_);
}

DataIter::Iterator& DataIter::Iterator::operator++() {
  ++i_;
  if (i_ < it_->num_batches()) batch_ = it_->batch(*order_, i_);
  return *this;
}

FashionMnistIters load_data_fashion_mnist(int64_t batch_size, const std::string& dir, uint64_t seed) {
  if (batch_size <= 0)  // checked before the (slow) load
    throw std::invalid_argument("batch_size " + std::to_string(batch_size) + " is invalid; expected >= 1");
  return {DataIter(load_split(dir, true), batch_size, true, seed),
          DataIter(load_split(dir, false), batch_size, false, seed)};
}

}  // namespace d2l
