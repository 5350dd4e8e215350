// What the layers of core/nn share: Gluon's int-or-pair arguments (kernel_size=3 or (3, 5)), how
// they print, and deferred shapes completed at the first forward with a clear error when a later
// input does not fit. (The activation names a layer accepts: core/nn/activation.hpp.)
#pragma once
#include <cstdint>
#include <string>

#include "core/nn/block.hpp"
#include "core/ops.hpp"

namespace d2l::nn {

// kernel_size=3 or kernel_size={3, 5} (height, width): either form where Gluon takes an int or a tuple.
struct Size2 {
  Pair hw;
  Size2(int64_t n) : hw{n, n} {}  // implicit on purpose: Conv2D(64, 3)
  Size2(int64_t h, int64_t w) : hw{h, w} {}
  Size2(Pair p) : hw(p) {}
};

using d2l::str;           // str(Shape) stays visible in d2l::nn beside
std::string str(Pair p);  // "(3, 3)", as Python prints a tuple

// The first forward completes p's deferred shape to `wanted` (what input x asks for); later inputs
// must ask for the same shape. A mismatch is one ShapeError naming the block, x's shape, the shape x
// needs and the shape the parameter has.
void infer_shape(const Block& block, Parameter& p, const Shape& wanted, const Tensor& x);

// x must have between lo and hi axes, else a ShapeError naming the block, `expected` and x's shape.
void expect_rank(const Block& block, const Tensor& x, const char* expected, int64_t lo, int64_t hi = INT64_MAX);

}  // namespace d2l::nn
