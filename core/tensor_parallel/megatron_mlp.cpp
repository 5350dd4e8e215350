#include "core/tensor_parallel/megatron_mlp.hpp"

namespace d2l::tp {

MegatronMLP::MegatronMLP(int64_t hidden, int64_t out, const std::vector<Device>& devices, const std::string& activation,
                         int64_t in_units) {
  fc1 = register_child("fc1", std::make_shared<ColumnParallelDense>(hidden, devices, activation, true, in_units));
  fc2 = register_child("fc2", std::make_shared<RowParallelDense>(out, hidden, devices));
}

MegatronMLP::MegatronMLP(int64_t hidden, int64_t out, const dist::Group& group, Device device,
                         const std::string& activation, int64_t in_units) {
  fc1 = register_child("fc1", std::make_shared<ColumnParallelDense>(hidden, group, device, activation, true, in_units));
  fc2 = register_child("fc2", std::make_shared<RowParallelDense>(out, hidden, group, device));
}

std::vector<Tensor> MegatronMLP::forward_shards(const std::vector<Tensor>& xs) {
  return fc2->forward_shards(fc1->forward_shards(xs));
}

namespace {

// Rows [r0, r0 + rows) and columns [c0, c0 + cols) of a row-major (R, C) matrix given as host values.
std::vector<float> block_of(const std::vector<float>& m, int64_t C, int64_t r0, int64_t rows, int64_t c0, int64_t cols) {
  std::vector<float> out;
  out.reserve(static_cast<size_t>(rows * cols));
  for (int64_t r = r0; r < r0 + rows; ++r)
    out.insert(out.end(), m.begin() + r * C + c0, m.begin() + r * C + c0 + cols);
  return out;
}

std::vector<float> values_of(const nn::ParameterPtr& p) { return p->list_data().at(0).to_vector(); }

// The two Dense layers' shapes, checked: {hidden, in, out}.
struct MlpShape {
  int64_t hidden, in, out;
};
MlpShape check_mlp(const nn::Dense& fc1, const nn::Dense& fc2) {
  const char* who = "shard_mlp";
  if (!fc1.weight->initialized() || !fc2.weight->initialized() || !fc1.weight->shape_known() || !fc2.weight->shape_known())
    throw ConfigError(std::string(who) + ": both Dense layers must be initialised with known shapes");
  if (!fc1.bias || !fc2.bias) throw ConfigError(std::string(who) + ": both Dense layers need a bias");
  if (!fc2.activation().empty())
    throw ConfigError(std::string(who) + ": the second Dense must be linear, got Activation(" + fc2.activation() + ")");
  const int64_t hidden = fc1.weight->shape()[0], in = fc1.weight->shape()[1], out = fc2.weight->shape()[0];
  if (fc2.weight->shape()[1] != hidden)
    throw ConfigError(std::string(who) + ": the second Dense takes " + std::to_string(fc2.weight->shape()[1]) +
                      " inputs, the first gives " + std::to_string(hidden));
  return {hidden, in, out};
}

// Gives the MLP's k-th local shard (on device d) slice `slice` of P: fc1's rows and fc2's columns
// [slice h, (slice + 1) h), h = hidden / P.
void copy_slice(MegatronMLP& mlp, size_t k, Device d, int64_t slice, int64_t P, const MlpShape& m, const nn::Dense& fc1,
                const nn::Dense& fc2) {
  const int64_t h = m.hidden / P, h0 = slice * h;
  const std::vector<float> w1 = values_of(fc1.weight), b1 = values_of(fc1.bias), w2 = values_of(fc2.weight);
  mlp.fc1->shards()[k]->weight->set_data(Tensor::from_vector(block_of(w1, m.in, h0, h, 0, m.in), {h, m.in}, d));
  mlp.fc1->shards()[k]->bias->set_data(Tensor::from_vector(block_of(b1, 1, h0, h, 0, 1), {h}, d));
  mlp.fc2->shards()[k]->weight->set_data(Tensor::from_vector(block_of(w2, m.hidden, 0, m.out, h0, h), {m.out, h}, d));
}

}  // namespace

std::shared_ptr<MegatronMLP> shard_mlp(const nn::Dense& fc1, const nn::Dense& fc2, const std::vector<Device>& devices) {
  const MlpShape m = check_mlp(fc1, fc2);
  auto mlp = std::make_shared<MegatronMLP>(m.hidden, m.out, devices, fc1.activation(), m.in);  // checks the group
  const auto P = static_cast<int64_t>(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) copy_slice(*mlp, i, devices[i], static_cast<int64_t>(i), P, m, fc1, fc2);
  mlp->fc2->bias->set_data(fc2.bias->list_data().at(0));
  return mlp;
}

std::shared_ptr<MegatronMLP> shard_mlp(const nn::Dense& fc1, const nn::Dense& fc2, const dist::Group& group, Device device) {
  const MlpShape m = check_mlp(fc1, fc2);
  auto mlp = std::make_shared<MegatronMLP>(m.hidden, m.out, group, device, fc1.activation(), m.in);  // checks the group
  copy_slice(*mlp, 0, device, group.rank(), group.size(), m, fc1, fc2);
  mlp->fc2->bias->set_data(fc2.bias->list_data().at(0).to(device));
  return mlp;
}

}  // namespace d2l::tp
