#include "core/nn/sequential.hpp"

#include <stdexcept>

namespace d2l::nn {

void Sequential::add_one(BlockPtr block) { add_child(std::to_string(children().size()), std::move(block)); }

Tensor Sequential::forward(const Tensor& x) {
  Tensor y = x;
  for (auto& [name, child] : children()) y = child->forward(y);
  return y;
}

std::vector<Tensor> Sequential::forward_shards(const std::vector<Tensor>& xs) {
  std::vector<Tensor> ys = xs;
  for (auto& [name, child] : children()) ys = child->forward_shards(ys);
  return ys;
}

BlockPtr Sequential::at(int64_t i) const {
  int64_t n = static_cast<int64_t>(size());
  if (i < -n || i >= n)
    throw std::out_of_range("Sequential: index " + std::to_string(i) + " is out of range for " + std::to_string(n) +
                            (n == 1 ? " block" : " blocks"));
  return children()[static_cast<size_t>(i < 0 ? i + n : i)].second;
}

}  // namespace d2l::nn
