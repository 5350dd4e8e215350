#include "core/tensor_parallel/megatron_mlp.hpp"

namespace d2l::tp {

MegatronMLP::MegatronMLP(int64_t hidden, int64_t out, const std::vector<Device>& devices, const std::string& activation,
                         int64_t in_units) {
  fc1 = register_child("fc1", std::make_shared<ColumnParallelDense>(hidden, devices, activation, true, in_units));
  fc2 = register_child("fc2", std::make_shared<RowParallelDense>(out, hidden, devices));
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

}  // namespace

std::shared_ptr<MegatronMLP> shard_mlp(const nn::Dense& fc1, const nn::Dense& fc2, const std::vector<Device>& devices) {
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
  auto mlp = std::make_shared<MegatronMLP>(hidden, out, devices, fc1.activation(), in);  // checks the group
  const int64_t h = hidden / static_cast<int64_t>(devices.size());
  const std::vector<float> w1 = values_of(fc1.weight), b1 = values_of(fc1.bias), w2 = values_of(fc2.weight);
  for (size_t i = 0; i < devices.size(); ++i) {
    const Device d = devices[i];
    const int64_t h0 = static_cast<int64_t>(i) * h;
    mlp->fc1->shards()[i]->weight->set_data(Tensor::from_vector(block_of(w1, in, h0, h, 0, in), {h, in}, d));
    mlp->fc1->shards()[i]->bias->set_data(Tensor::from_vector(block_of(b1, 1, h0, h, 0, 1), {h}, d));
    mlp->fc2->shards()[i]->weight->set_data(Tensor::from_vector(block_of(w2, hidden, 0, out, h0, h), {out, h}, d));
  }
  mlp->fc2->bias->set_data(fc2.bias->list_data().at(0));
  return mlp;
}

}  // namespace d2l::tp
