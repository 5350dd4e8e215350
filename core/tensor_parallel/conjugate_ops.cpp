#include "core/tensor_parallel/conjugate_ops.hpp"

#include <atomic>
#include <memory>
#include <utility>

#include "core/autograd.hpp"
#include "core/comm.hpp"
#include "core/dist/collectives.hpp"
#include "core/ops/op.hpp"

namespace d2l::tp {

namespace {

std::atomic<int64_t> g_allreduces{0}, g_payload_bytes{0};

// Every group op's input: at least one tensor, float32, one shape, one tensor per device.
void check_group_value(const char* op, const std::vector<Tensor>& xs) {
  if (xs.empty()) detail::fail(op, "needs one tensor per device of the group, got none");
  for (size_t i = 0; i < xs.size(); ++i) {
    detail::expect_f32(op, xs[i], "every tensor");
    if (xs[i].shape() != xs[0].shape())
      detail::fail(op, "every device's tensor must have one shape, got " + str(xs[0].shape()) + " and " +
                           str(xs[i].shape()));
    for (size_t j = 0; j < i; ++j)
      if (xs[j].device() == xs[i].device()) detail::fail(op, "two tensors on " + xs[i].device().str());
  }
}

void count_allreduce(const Tensor& t) {
  g_allreduces += 1;
  g_payload_bytes += t.numel() * static_cast<int64_t>(sizeof(float));
}

// The one allreduce of f and g: in place over the group, counted.
void sum_over_group(const std::vector<Tensor>& ts) {
  NoGrad no_grad;
  allreduce_ring(ts);
  count_allreduce(ts[0]);
}

// The same over the ranks of a process group.
void sum_over_group(const Tensor& t, const dist::Group& group) {
  NoGrad no_grad;
  dist::allreduce(t, group, "ring");
  count_allreduce(t);
}

void check_rank_value(const char* op, const Tensor& x) {
  if (!x.defined()) detail::fail(op, "needs this rank's tensor, got an undefined one");
  detail::expect_f32(op, x, "the tensor");
}

// Under an Autocast scope, each input as the list (core/ops/autocast.cpp) says: float32.
std::vector<Tensor> autocast_inputs(const char* op, const std::vector<Tensor>& xs) {
  std::vector<Tensor> out;
  for (const Tensor& x : xs) out.push_back(detail::autocast_input(op, x));
  return out;
}

}  // namespace

std::vector<Tensor> copy_to_parallel_region(const std::vector<Tensor>& xs_in) {
  const char* op = "tp_copy_to_parallel_region";
  const std::vector<Tensor> xs = autocast_inputs(op, xs_in);
  check_group_value(op, xs);
  const size_t P = xs.size();
  // The gradients of the Y_i, kept until the last of them arrives.
  struct Pending {
    std::vector<Tensor> grads;
    size_t arrived = 0;
  };
  auto pending = std::make_shared<Pending>();
  pending->grads.resize(P);
  std::vector<Tensor> ys;
  for (size_t i = 0; i < P; ++i) {
    Tensor y = xs[i].detach();  // the same memory: f's forward moves nothing
    record(y, op, xs, [pending, i, P](const Tensor& gy) {
      pending->grads[i] = gy.clone();  // summed in place; gy may be shared with other nodes
      if (++pending->arrived < P) return std::vector<Tensor>{};
      sum_over_group(pending->grads);
      return std::exchange(pending->grads, std::vector<Tensor>(P));  // grads[j] (on device j) is X_j's
    });
    ys.push_back(y);
  }
  return ys;
}

std::vector<Tensor> reduce_from_parallel_region(const std::vector<Tensor>& zs_in) {
  const char* op = "tp_reduce_from_parallel_region";
  const std::vector<Tensor> zs = autocast_inputs(op, zs_in);
  check_group_value(op, zs);
  std::vector<Tensor> ys;
  {
    NoGrad no_grad;
    for (const Tensor& z : zs) ys.push_back(z.clone());
  }
  sum_over_group(ys);
  for (size_t i = 0; i < zs.size(); ++i)
    record(ys[i], op, {zs[i]}, [](const Tensor& gy) { return std::vector<Tensor>{gy}; });
  return ys;
}

Tensor copy_to_parallel_region(const Tensor& x_in, const dist::Group& group) {
  const char* op = "tp_copy_to_parallel_region";
  const Tensor x = detail::autocast_input(op, x_in);
  check_rank_value(op, x);
  Tensor y = x.detach();  // forward: the identity
  record(y, op, {x}, [group](const Tensor& gy) {
    Tensor g = gy.clone();  // summed in place; gy may be shared with other nodes
    sum_over_group(g, group);
    return std::vector<Tensor>{g};
  });
  return y;
}

Tensor reduce_from_parallel_region(const Tensor& z_in, const dist::Group& group) {
  const char* op = "tp_reduce_from_parallel_region";
  const Tensor z = detail::autocast_input(op, z_in);
  check_rank_value(op, z);
  Tensor y;
  {
    NoGrad no_grad;
    y = z.clone();
  }
  sum_over_group(y, group);
  record(y, op, {z}, [](const Tensor& gy) { return std::vector<Tensor>{gy}; });  // backward: the identity
  return y;
}

Traffic traffic() { return {g_allreduces.load(), g_payload_bytes.load()}; }

void reset_traffic() {
  g_allreduces = 0;
  g_payload_bytes = 0;
}

void check_group(const char* who, const std::vector<Device>& devices) {
  if (devices.empty()) throw ConfigError(std::string(who) + ": needs at least one device");
  for (size_t i = 0; i < devices.size(); ++i)
    for (size_t j = 0; j < i; ++j)
      if (devices[i] == devices[j])
        throw ConfigError(std::string(who) + ": device " + devices[i].str() + " is listed twice in " + str(devices));
}

}  // namespace d2l::tp
