// Shapes: the dimensions of a tensor, row-major, and the error for a wrong one. Below the tensors, so
// that files with shapes and no tensors (core/io/safetensors.hpp) stand on the floor beneath them.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace d2l {

using Shape = std::vector<int64_t>;
std::string str(const Shape& s);  // "(2, 3)"
int64_t numel(const Shape& s);

// Wrong shapes, dtypes or devices for an op: one line naming the op and what it expected.
struct ShapeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

}  // namespace d2l
