// Gluon's nn.Sequential: children run in the order they were added, named "0", "1", ... (PyTorch's
// naming, so parameters are "0.weight", "1.bias", ... in a checkpoint).
//
//   auto net = std::make_shared<Sequential>();
//   net->add(std::make_shared<Conv2D>(64, 3, 1, 1), std::make_shared<BatchNorm>(),
//            std::make_shared<Activation>("relu"));
//   (*net)[0]   // the Conv2D, as net[0] in Gluon
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/nn/block.hpp"

namespace d2l::nn {

class Sequential : public Block {
 public:
  Sequential() = default;

  // Appends blocks in order (one or several per call, as Gluon's net.add(a, b, c)).
  template <class... B>
  Sequential& add(const std::shared_ptr<B>&... blocks) {
    (add_one(blocks), ...);
    return *this;
  }

  Tensor forward(const Tensor& x) override;  // children in order
  // Layer by layer over all shards, so a child that looks across shards (SyncBatchNorm) sees them all.
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override;
  std::string type() const override { return "Sequential"; }

  // The i-th child; negative i counts from the end (Python's net[-1]). Out of range:
  // std::out_of_range naming the index and the size (Python's IndexError).
  BlockPtr operator[](int64_t i) const { return at(i); }
  BlockPtr at(int64_t i) const;
  size_t size() const { return children().size(); }

 private:
  void add_one(BlockPtr block);
};

}  // namespace d2l::nn
