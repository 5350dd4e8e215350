// Tensor parallelism inside one process (Megatron-LM, Shoeybi et al. 2019, section 3): the two
// conjugate operators f and g over a group of P devices. A group value is one tensor per device,
// xs[i] on devices[i]. Two kinds of group values meet here:
//   replicated  every device holds the same logical tensor X (the input of a column-parallel layer,
//               the output of a row-parallel one);
//   split       device i holds only its part (a column-parallel layer's output columns, a
//               row-parallel layer's partial sum).
// The loss is computed on every device from its replica of the output, and the book's
// `for l in ls: l.backward()` runs one backward per device loss: each replica's backward is the
// gradient of the one logical loss, not a share of it. Under that convention
//
//   f  (paper's Fig. 3a, before the column-parallel layer): forward  Y_i = X_i      (identity)
//                                                          backward dX = sum_i dY_i (allreduce)
//      X is read by every device's shard, so its gradient is the sum of what each shard gives.
//   g  (after the row-parallel layer):                     forward  Y = sum_i Z_i   (allreduce)
//                                                          backward dZ_i = dY_i     (identity)
//      every replica of Y carries the whole gradient of the loss, so each partial Z_i gets it.
//
// Both sum with core/comm.hpp's ring allreduce (cpu(i), emu(i) and gpu(i) devices; the tests run
// cpu(i) and emu(i)), and the sum is bitwise the same on every device.
//
// How f's backward gathers P gradients that arrive in P different backward calls: the node of each
// Y_i lists every X_j as an input (so no X_j's own node runs before all of f's nodes have). The
// first P-1 nodes reached keep their gradient and give none; the last one allreduces the P kept
// gradients and gives X_j its sum. So every device's loss must be backpropagated (once) before X's
// gradient exists, and f sends nothing when no X_i needs a gradient (autograd records no node).
//
// Over processes (core/dist/group.hpp), the group is P ranks of a dist::Group, one device each, and
// a group value is this rank's one tensor: the same f and g, their sum an allreduce over the group's
// ranks (dist::allreduce's ring: the same bits on every rank). Each rank runs one backward, of its
// own replica of the loss, so f's backward simply sums its one gradient over the group.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/dist/group.hpp"
#include "core/tensor.hpp"

namespace d2l::tp {

// f, Megatron's copy_to_tensor_model_parallel_region. xs: one float32 tensor per device, same shape,
// no device twice (otherwise a ShapeError naming the op).
std::vector<Tensor> copy_to_parallel_region(const std::vector<Tensor>& xs);
// g, Megatron's reduce_from_tensor_model_parallel_region. Same requirements on zs.
std::vector<Tensor> reduce_from_parallel_region(const std::vector<Tensor>& zs);
// f and g over the ranks of a process group: x (z) is this rank's tensor, float32, of one shape on
// every rank of the group. Every rank of the group calls them at the same point, as any collective.
Tensor copy_to_parallel_region(const Tensor& x, const dist::Group& group);
Tensor reduce_from_parallel_region(const Tensor& z, const dist::Group& group);

// What f and g have sent since the last reset (on this rank, over devices or processes): one
// allreduce per call of g's forward and of f's backward, and its payload, the bytes of the tensor being summed (numel * 4). The ring moves
// 2 (P-1)/P of the payload out of each device; that is the algorithm's, not counted here.
struct Traffic {
  int64_t allreduces = 0;
  int64_t payload_bytes = 0;
};
Traffic traffic();
void reset_traffic();

// The devices of a tensor-parallel layer: a ConfigError naming `who` when the list is empty or
// names a device twice.
void check_group(const char* who, const std::vector<Device>& devices);

}  // namespace d2l::tp
