// One minibatch on every device and the test accuracy (d2l "Concise Implementation for Multiple GPUs",
// "Training"; the Gluon lab's forward_backward / train_batch / valid_batch), and the data they read.
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"

#include "core/cli.hpp"

#include "core/autograd.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::concise {

Tensor loss(const Tensor& y_hat, const Tensor& y) { return softmax_cross_entropy(y_hat, y, Reduction::none); }

std::vector<Tensor> forward_backward(nn::Block& net, const std::vector<Tensor>& Xs, const std::vector<Tensor>& ys,
                                     const optim::GradScaler& scaler) {
  // with autograd.record(): losses = [loss(net(X), Y) for X, Y in zip(data, label)]
  // net(Xs) is net(X) on each shard, layer by layer over all shards, so a SyncBatchNorm sees the
  // whole batch; with plain BatchNorm it computes exactly net(X) per shard.
  std::vector<Tensor> outputs = net(Xs);
  std::vector<Tensor> losses;
  for (size_t i = 0; i < outputs.size(); ++i)
    losses.push_back(sum(loss(outputs[i], ys[i])));  // MXNet's l.backward() of a vector is that of its sum
  for (auto& l : losses) scaler.scale(l).backward();  // each device's backward, enqueued on that device
  std::vector<Tensor> out;
  for (auto& l : losses) out.push_back(l.detach());
  return out;
}

nn::BatchShards split_and_load(const Batch& batch, const std::vector<Device>& devices, const std::vector<double>& weights) {
  // Gluon's even_split=True would refuse a batch that does not divide evenly: here shards differ by
  // at most one example
  return weights.empty() ? nn::split_and_load(batch, devices, false) : nn::split_and_load(batch, devices, weights);
}

std::vector<Tensor> train_batch(const Batch& batch, nn::Block& net, optim::Trainer& trainer,
                                const std::vector<Device>& devices, const std::vector<double>& weights) {
  // split the data batch and load them on the devices
  nn::BatchShards shards = split_and_load(batch, devices, weights);
  // compute gradient (a process whose share of a short last minibatch is empty only takes part in the step)
  std::vector<Tensor> losses = batch.n > 0 ? forward_backward(net, shards.X, shards.y) : std::vector<Tensor>{};
  // update parameters: the kvstore sums every replica's gradient; the step divides by the batch size
  trainer.step(batch.size());  // the whole minibatch, over every process
  return losses;
}

double evaluate_accuracy(const DataIter& data_iter, nn::Block& net, const std::vector<Device>& devices) {
  NoGrad no_grad;
  TrainMode eval(false);
  double correct = 0;
  std::vector<Tensor> counts;  // batch i-1's, read once batch i is assembled: one batch in flight
  for (const Batch& b : data_iter.epoch(0)) {
    check_interrupt();  // Ctrl-C / SIGTERM during evaluation: stop between batches
    for (auto& c : counts) correct += c.item();
    counts.clear();
    if (b.n == 0) continue;  // this process's share of a short last batch (dist_sync)
    nn::BatchShards shards = nn::split_and_load(b, devices, false);
    std::vector<Tensor> outputs = net(shards.X);
    for (size_t i = 0; i < outputs.size(); ++i) counts.push_back(count_correct(outputs[i], shards.y[i]));
  }
  for (auto& c : counts) correct += c.item();
  return correct / static_cast<double>(data_iter.size());
}

namespace {

ArrayDataset first(ArrayDataset d, int64_t n, const char* flag, const char* which) {
  if (n <= 0) return d;
  if (n > d.n)
    throw ConfigError(std::string("bad ") + flag + " " + std::to_string(n) + ": the " + which + " set has " +
                      std::to_string(d.n) + " images");
  int64_t row = numel(d.feature_shape);
  d.features.resize(static_cast<size_t>(n * row));
  d.labels.resize(static_cast<size_t>(n));
  d.n = n;
  return d;
}

}  // namespace

ArrayDataset load_data(const Config& cfg, bool train) {
  const std::optional<ArrayDataset>& generated = train ? cfg.train_data : cfg.test_data;
  // gb.load_data_fashion_mnist(batch_size): 28x28 images, pixels / 255
  ArrayDataset d = generated ? *generated : to_array_dataset(load_split(cfg.data_dir, train));
  if (d.n == 0)  // an epoch of no minibatches would "train" and report nonsense
    throw DataError(std::string("the ") + (train ? "training" : "test") + " set in " +
                    (generated ? std::string("the generated data") : "'" + cfg.data_dir + "'") + " has no examples");
  return train ? first(std::move(d), cfg.train_subset, "--train-subset", "training")
               : first(std::move(d), cfg.test_subset, "--test-subset", "test");
}

const Recipe& recipe(const std::string& model) { return model == "lab-cnn" ? kLabCnn : kBookResNet18; }

void make_quick(Config& cfg) {
  const bool resnet = cfg.model == "resnet18";
  const int64_t side = resnet ? 12 : 28;
  cfg.train_data = make_image_classification(resnet ? 800 : 4000, side, 10, cfg.seed + 1);
  cfg.test_data = make_image_classification(resnet ? 200 : 1000, side, 10, cfg.seed + 2);
  const Recipe& r = resnet ? kQuickResNet18 : kQuickLabCnn;
  cfg.batch_size = r.batch_per_device * static_cast<int64_t>(cfg.devices.size());
  cfg.lr = r.lr_per_device;
  cfg.num_epochs = r.num_epochs;
}

}  // namespace d2l::concise
