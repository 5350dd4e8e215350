// Minibatch iterator over examples held in host memory: the data loader yields batches in host
// memory, and the training code copies each batch to its devices. Mirrors the book's
// data.DataLoader(dataset, batch_size, shuffle): the last partial batch is kept, and each pass over
// a shuffled iterator sees a new order. Orders are deterministic: epoch e uses seed + e.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "datasets/fashion_mnist.hpp"

namespace d2l {

// Any labelled data set: features (n, feature_shape...) and int32 labels (n). Generated data sets
// (synthetic regression, tests) build one of these directly.
struct ArrayDataset {
  int64_t n = 0;
  std::vector<int64_t> feature_shape;  // per example, e.g. (1, 28, 28)
  std::vector<float> features;         // (n, feature_shape...)
  std::vector<int32_t> labels;         // (n)
};

// Fashion-MNIST images become features of shape (1, rows, cols). Moves the vectors.
ArrayDataset to_array_dataset(Dataset d);

struct Batch {
  std::vector<float> X;          // (n, feature_shape...)
  std::vector<int32_t> y;        // (n)
  int64_t n = 0;                 // examples in this batch: batch_size, or fewer for the last one
  int64_t global_n = 0;          // examples in the whole minibatch, over every process (shard())
  std::vector<int64_t> shape;    // X's shape, e.g. (n, 1, 28, 28)
  // The minibatch size an update divides by: the whole minibatch's (global_n) when it is set.
  int64_t size() const { return global_n > 0 ? global_n : n; }
};

class DataIter {
 public:
  // batch_size <= 0 throws std::invalid_argument. The data is shared by copies of the iterator.
  DataIter(ArrayDataset data, int64_t batch_size, bool shuffle, uint64_t seed = 0);
  DataIter(Dataset data, int64_t batch_size, bool shuffle, uint64_t seed = 0);

  int64_t num_batches() const { return (size() + batch_size_ - 1) / batch_size_; }
  int64_t size() const { return data_->n; }  // number of examples
  int64_t batch_size() const { return batch_size_; }
  const ArrayDataset& data() const { return *data_; }

  // Data parallelism over processes: each minibatch is cut into `parts` shards as even as possible
  // (sizes differ by at most one, the first ones larger), as split_batch cuts it over devices, and
  // this iterator yields only shards [first, last) of each: the rows of this process's devices.
  // Every process sees the same order and the same number of minibatches (a short last minibatch
  // is cut the same way; a process may get fewer rows, or none), and each example of an epoch
  // goes to exactly one process. Batch::n counts this process's rows, Batch::global_n the whole.
  void shard(int64_t parts, int64_t first, int64_t last);

  // Example indices in the order epoch `epoch` visits them: 0..n-1 unless shuffling.
  std::vector<int64_t> order(int64_t epoch) const;
  // Batch i (0 <= i < num_batches()) of a given order.
  Batch batch(const std::vector<int64_t>& order, int64_t i) const;

  // One pass: for (const Batch& b : iter.epoch(e)) ...
  class Epoch;
  Epoch epoch(int64_t e) const;
  // Book style, for (const Batch& b : train_iter): each begin() starts the next epoch (0, 1, ...).
  class Iterator;
  Iterator begin();
  Iterator end();

 private:
  std::shared_ptr<const ArrayDataset> data_;
  int64_t batch_size_;
  bool shuffle_;
  uint64_t seed_;
  int64_t next_epoch_ = 0;
  int64_t parts_ = 1, first_ = 0, last_ = 1;  // shard()
};

class DataIter::Iterator {
 public:
  Iterator(const DataIter* it, std::shared_ptr<const std::vector<int64_t>> order, int64_t i);
  const Batch& operator*() const { return batch_; }
  const Batch* operator->() const { return &batch_; }
  Iterator& operator++();
  bool operator==(const Iterator& o) const { return i_ == o.i_; }
  bool operator!=(const Iterator& o) const { return i_ != o.i_; }

 private:
  const DataIter* it_;
  std::shared_ptr<const std::vector<int64_t>> order_;
  int64_t i_;
  Batch batch_;
};

class DataIter::Epoch {
 public:
  Epoch(const DataIter* it, int64_t e) : it_(it), order_(std::make_shared<std::vector<int64_t>>(it->order(e))) {}
  Iterator begin() const { return Iterator(it_, order_, 0); }
  Iterator end() const { return Iterator(it_, order_, it_->num_batches()); }

 private:
  const DataIter* it_;
  std::shared_ptr<const std::vector<int64_t>> order_;
};

// The book's helper: {train_iter (shuffled), test_iter (in file order)} over Fashion-MNIST, or over
// any IDX directory (MNIST digits too). dir "" means --data-dir's lookup order (resolve_data_dir).
struct FashionMnistIters {
  DataIter train_iter;
  DataIter test_iter;
};
FashionMnistIters load_data_fashion_mnist(int64_t batch_size, const std::string& dir = "", uint64_t seed = 0);

}  // namespace d2l
