// Megatron-LM's MLP (Shoeybi et al. 2019, section 3, Fig. 3a) over P devices:
//
//   X (replicated) -> f -> [X A_1 | ... | X A_P] -> relu per shard -> [Y_1 | ... | Y_P]
//                  -> Z_i = Y_i B_i on device i -> g: Z = sum_i Z_i (replicated) -> + b
//
// A is split by output features (ColumnParallelDense), B by input features (RowParallelDense), so
// the activation needs no communication between the two GEMMs (the paper's equation 3; splitting A
// by rows, its equation 2, would need the sum before the nonlinearity, and relu(X1 A1 + X2 A2) is
// not relu(X1 A1) + relu(X2 A2)). The paper's activation is GeLU; here relu. Per training step the MLP communicates exactly twice, one allreduce of the
// (batch, d_model) output in the forward pass (g) and one of the (batch, d_model) input gradient in
// the backward pass (f; only when the input needs a gradient):
//
//   payload per step = 2 allreduces * batch * d_model * 4 bytes (float32)
//
// where d_model is the MLP's input and output width (its hidden width is usually 4 d_model).
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/tensor_parallel/parallel_dense.hpp"

namespace d2l::tp {

class MegatronMLP : public nn::Block {
 public:
  // fc1: ColumnParallelDense(hidden, activation), fc2: RowParallelDense(out, hidden), both over `devices`.
  MegatronMLP(int64_t hidden, int64_t out, const std::vector<Device>& devices, const std::string& activation = "relu",
              int64_t in_units = 0);
  // This rank's shards of both layers, over the ranks of a process group (one device each).
  MegatronMLP(int64_t hidden, int64_t out, const dist::Group& group, Device device, const std::string& activation = "relu",
              int64_t in_units = 0);

  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override;  // replicated -> replicated
  std::string type() const override { return "MegatronMLP"; }

  std::shared_ptr<ColumnParallelDense> fc1;
  std::shared_ptr<RowParallelDense> fc2;
};

// The MLP fc1 -> fc2 (fc1 a Dense with its activation, fc2 a linear Dense taking fc1's units, both
// initialised) sharded over `devices`: the weights sliced, fc1's by its output rows and fc2's by its
// input columns, each slice copied to its device; fc2's bias copied to every device. Gives the same
// function as the unsharded MLP. A ConfigError for shapes that do not chain, an fc2 with an
// activation, or a group that does not divide fc1's units.
std::shared_ptr<MegatronMLP> shard_mlp(const nn::Dense& fc1, const nn::Dense& fc2, const std::vector<Device>& devices);
// The same over the ranks of a process group: this rank builds only its own shard, slice
// group.rank() of group.size() (fc1's rows, fc2's columns), on `device`, and fc2's bias whole.
// Every rank of the group passes the same fc1 and fc2 (the same initial weights).
std::shared_ptr<MegatronMLP> shard_mlp(const nn::Dense& fc1, const nn::Dense& fc2, const dist::Group& group, Device device);

}  // namespace d2l::tp
