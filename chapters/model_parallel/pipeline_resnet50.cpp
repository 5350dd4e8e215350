#include "chapters/model_parallel/pipeline_resnet50.hpp"

#include "core/ops.hpp"

namespace d2l::mp {

std::vector<size_t> default_partition(size_t K, size_t num_layers) {
  if (K < 1 || K > num_layers)
    throw ConfigError("--stages " + std::to_string(K) + ": expected 1 to " + std::to_string(num_layers) +
                      " stages for " + std::to_string(num_layers) + " blocks");
  if (K == 2 && num_layers == 22) return {0, 11};  // conv1 .. layer2 | layer3 .. fc, the section's seq1 | seq2
  std::vector<size_t> starts;
  size_t at = 0;
  for (size_t s = 0; s < K; ++s) {
    starts.push_back(at);
    at += num_layers / K + (s < num_layers % K ? 1 : 0);
  }
  return starts;
}

PipelineParallelResNet50::PipelineParallelResNet50(int64_t split_size, const std::vector<Device>& devices,
                                                   pipeline::Schedule schedule, const std::vector<size_t>& starts,
                                                   int64_t num_classes)
    : ModelParallelResNet50(devices.at(0), devices.at(devices.size() > 1 ? 1 : 0), num_classes),
      devices(devices),
      split_size(split_size),
      schedule(schedule) {
  if (devices.size() < 2)
    throw ConfigError("PipelineParallelResNet50: needs at least 2 devices, got " + str(devices));
  if (split_size < 1) throw ConfigError("bad --split-size " + std::to_string(split_size) + ": expected a number >= 1");
  set_partition(starts.empty() ? default_partition(devices.size()) : starts);
}

void PipelineParallelResNet50::set_partition(const std::vector<size_t>& starts) {
  const size_t L = layer_names().size(), K = devices.size();
  bool ok = starts.size() == K && !starts.empty() && starts[0] == 0;
  for (size_t s = 1; ok && s < starts.size(); ++s) ok = starts[s] > starts[s - 1] && starts[s] < L;
  if (!ok) {
    std::string given;
    for (size_t s = 0; s < starts.size(); ++s) given += (s ? "," : "") + std::to_string(starts[s]);
    throw ConfigError("bad --partition '" + given + "': expected " + std::to_string(K) +
                      " increasing block indices starting at 0 and below " + std::to_string(L) + " (one per stage)");
  }
  auto parts = pipeline::partition(*layer_list(), starts);
  stages.clear();
  for (size_t s = 0; s < K; ++s) {
    parts[s]->to(devices[s]);
    stages.push_back(pipeline::Stage{parts[s], devices[s]});
  }
  starts_ = starts;
}

std::string PipelineParallelResNet50::partition_str() const {
  auto names = layer_names();
  std::string s;
  for (size_t k = 0; k < starts_.size(); ++k) {
    size_t end = k + 1 < starts_.size() ? starts_[k + 1] : names.size();
    s += (k ? " | " : "") + names[starts_[k]] + (end - starts_[k] > 1 ? ".." + names[end - 1] : "") + " on " +
         devices[k].str();
  }
  return s;
}

// The section's pipelined forward as it writes it, for its two devices: micro-batch i+1 goes through
// seq1 on device 0 while micro-batch i goes through seq2 and fc on device 1. The host only enqueues
// (each op is queued on its device's stream and returns at once), so, as with CUDA's asynchronous
// launches, the two devices work at the same time. Stage 0 is seq1, stage 1 is seq2 with the view
// and fc. core/pipeline's forward is this loop for K stages; forward_backward adds the backward
// passes in the order of a schedule (GPipe, 1F1B).
Tensor PipelineParallelResNet50::forward(const Tensor& x) {
  if (stages.size() != 2) return pipeline::forward(stages, x, split_size);
  const nn::BlockPtr &seq1 = stages[0].block, &seq2_fc = stages[1].block;
  // splits = iter(x.split(self.split_size, dim=0))
  std::vector<int64_t> sizes;
  for (auto [begin, end] : pipeline::micro_batches(x.dim(0), split_size)) sizes.push_back(end - begin);
  const std::vector<Tensor> splits = split(x.to(devices[0]), sizes);
  auto next = splits.begin();
  Tensor s_next = *next++;                                // s_next = next(splits)
  Tensor s_prev = seq1->forward(s_next).to(devices[1]);  // s_prev = self.seq1(s_next).to('cuda:1')
  std::vector<Tensor> ret;
  for (; next != splits.end(); ++next) {  // for s_next in splits:
    s_next = *next;
    ret.push_back(seq2_fc->forward(s_prev));              //   ret.append(self.fc(self.seq2(s_prev).view(...)))
    s_prev = seq1->forward(s_next).to(devices[1]);        //   s_prev = self.seq1(s_next).to('cuda:1')
  }
  ret.push_back(seq2_fc->forward(s_prev));  // the last micro-batch through seq2 and fc
  return ret.size() == 1 ? ret[0] : concat(ret);  // torch.cat(ret)
}

Tensor PipelineParallelResNet50::forward_backward(const Tensor& x, const Tensor& target, const optim::GradScaler& scaler) {
  // PyTorch's MSELoss of the whole batch = sum over micro-batches of (sum of squares) / numel(batch);
  // d2l's mse_loss sums (p - t)^2 / 2, hence the 2. fp16: each share times the loss scale.
  const float scale = 2.0f / static_cast<float>(target.numel());
  pipeline::LossFn loss = [scale, &scaler](const Tensor& output, const Tensor& t) {
    return scaler.scale(d2l::mse_loss(output, t, Reduction::sum) * scale);
  };
  Tensor l = pipeline::forward_backward(stages, x, target, split_size, schedule, loss, checkpoint);
  return scaler.is_enabled() ? d2l::scale(l, 1.0f / scaler.get_scale()) : l;  // the loss itself, unscaled
}

std::vector<size_t> balanced_partition(PipelineParallelResNet50& model, const Tensor& sample, Device device, size_t K,
                                       std::vector<double>* costs) {
  auto layers = model.layer_list();
  layers->to(device);
  std::vector<double> c = pipeline::measure_layer_costs(*layers, sample, device);
  if (costs) *costs = c;
  return pipeline::balance(c, K);
}

}  // namespace d2l::mp
