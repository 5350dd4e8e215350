// Shared checks for op implementations (core/ops_*.cpp).
#pragma once
#include <string>
#include <vector>

#include "core/autograd.hpp"
#include "core/runtime.hpp"
#include "core/tensor.hpp"
#include "kernels/cpu/kernels.hpp"

namespace d2l::detail {

// All tensors defined, float32 (unless labels), on one device; returns that device.
Device same_device(const char* op, const std::vector<Tensor>& ts);
void expect_f32(const char* op, const Tensor& t, const char* what);
void expect_ndim(const char* op, const Tensor& t, int64_t n, const char* what);
[[noreturn]] void fail(const char* op, const std::string& msg);  // throws ShapeError "op: msg"

inline std::vector<std::shared_ptr<Storage>> keep(std::initializer_list<Tensor> ts) {
  std::vector<std::shared_ptr<Storage>> out;
  for (auto& t : ts) out.push_back(t.storage());
  return out;
}

}  // namespace d2l::detail
