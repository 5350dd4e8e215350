// What chapter 2's train() needs around the book's loop (run.hpp): the checked flags, the data, the
// devices' kernel threads, the processes of --kvstore dist_sync, exercise 2's measured split, and
// beside train(): evaluating a saved net (--load-params) and the plot of the runs.
#include "chapters/multi_gpu_concise/run.hpp"

#include <cctype>
#include <cmath>
#include <cstdio>

#include "chapters/harness/harness.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/checkpoint/parameters_file.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/optim/kvstore.hpp"
#include "core/plot.hpp"
#include "core/runtime.hpp"

namespace d2l::concise {

ThreadBudget::ThreadBudget(const std::vector<Device>& devices, const std::vector<int>& threads) {
  for (size_t i = 0; i < devices.size() && !threads.empty(); ++i) {
    if (devices[i].kind == DeviceKind::gpu) continue;  // a GPU's kernels have no CPU threads
    DeviceRuntime& rt = runtime(devices[i]);
    saved_.emplace_back(devices[i], rt.threads());
    rt.set_threads(threads.size() == 1 ? threads[0] : threads[i]);
  }
}

ThreadBudget::~ThreadBudget() {
  for (auto& [d, t] : saved_) runtime(d).set_threads(t);
}

namespace {

std::string list(const std::vector<double>& v) {
  std::string s;
  char buf[32];
  for (size_t i = 0; i < v.size(); ++i) {
    std::snprintf(buf, sizeof buf, "%s%.3g", i ? ", " : "", v[i]);
    s += buf;
  }
  return s;
}

// Exercise 2: each device's speed from a few timed forward and backward passes of its share of a
// batch, on a separate copy of the net (the probe's gradients never reach the trained one).
std::vector<double> measure_weights(const Config& cfg, const DataIter& train_iter) {
  auto probe = make_net(cfg.model, false);
  probe->initialize(default_init(cfg.model), cfg.devices);
  Batch b = train_iter.batch(train_iter.order(0), 0);
  const int64_t n = std::max<int64_t>(1, std::min(b.n, cfg.batch_size / static_cast<int64_t>(cfg.devices.size())));
  const int64_t row = static_cast<int64_t>(b.X.size()) / b.n;
  std::vector<float> xs(b.X.begin(), b.X.begin() + n * row);
  std::vector<int32_t> ys(b.y.begin(), b.y.begin() + n);
  Shape shape = b.shape;
  shape[0] = n;
  auto step = [&](Device d) {
    Tensor X = Tensor::from_vector(xs, shape, d), y = Tensor::from_vector(ys, {n}, d);
    forward_backward(*probe, {X}, {y});
  };
  std::vector<double> w = nn::probe_weights(cfg.devices, step);
  if (cfg.verbose) {
    std::printf("split weights from timed steps of %lld images on each device: %s\n", (long long)n, list(w).c_str());
    std::vector<double> sizes;
    for (int64_t s : nn::shard_sizes(cfg.batch_size, w)) sizes.push_back(static_cast<double>(s));
    std::printf("shards of a batch of %lld: %s\n", (long long)cfg.batch_size, list(sizes).c_str());
  }
  return w;
}

std::string model_name(const std::string& model) { return model == "resnet18" ? "ResNet-18" : "the lab's CNN"; }

}  // namespace

void validate(const Config& cfg) {
  const auto k = static_cast<int64_t>(cfg.devices.size());
  if (k == 0) throw ConfigError("no devices to train on");
  make_net(cfg.model, cfg.sync_bn);  // names the choices for a bad --model
  if (cfg.batch_size < 1) throw ConfigError("bad --batch-size " + std::to_string(cfg.batch_size) + ": expected a number > 0");
  if (cfg.batch_size < k)
    throw ConfigError("--batch-size " + std::to_string(cfg.batch_size) + " is smaller than the " + std::to_string(k) +
                      " devices: every device needs at least one example per minibatch");
  // Memory: autograd keeps every activation of a step, about 15 KB per input pixel per image for
  // ResNet-18 (3 GB a step at batch 256 of 28x28) and 0.5 KB for the lab's CNN; and a whole
  // minibatch's images are assembled in host memory.
  {
    const double side = cfg.train_data && cfg.train_data->feature_shape.size() == 3
                            ? static_cast<double>(cfg.train_data->feature_shape[2]) : 28.0;
    const double per_pixel = cfg.model == "resnet18" ? 15e3 : 0.5e3;
    require_memory("--batch-size", static_cast<double>(cfg.batch_size), static_cast<double>(cfg.batch_size) * side * side * per_pixel);
  }
  if (!(std::isfinite(cfg.lr) && cfg.lr > 0)) throw ConfigError("bad --lr " + std::to_string(cfg.lr) + ": expected a number > 0");
  if (cfg.num_epochs < 1) throw ConfigError("bad --num-epochs " + std::to_string(cfg.num_epochs) + ": expected a number > 0");
  if (cfg.kvstore != "device" && cfg.kvstore != "local" && cfg.kvstore != "ring" && !distributed(cfg))
    throw ConfigError("bad --kvstore '" + cfg.kvstore + "': expected device, local, ring, dist_sync or dist_sync_ring");
  if (cfg.in_flight < 1 || cfg.in_flight > 4)
    throw ConfigError("bad --in-flight " + std::to_string(cfg.in_flight) + ": expected 1 to 4 minibatches");
  if (!std::isfinite(cfg.bucket_mb) || cfg.bucket_mb > 1e6)
    throw ConfigError("bad --bucket-mb: expected a number of MB up to 1e6 (0: one bucket per parameter; < 0: none)");
  if (cfg.comm_type != DType::f32 && !(distributed(cfg) && cfg.bucket_mb >= 0))
    throw ConfigError(std::string("--comm-hook ") + dist::comm_hook_name(cfg.comm_type) +
                      " sums the gradient buckets of --kvstore dist_sync in 16 bits: give --kvstore dist_sync (with --bucket-mb >= 0)");
  if (distributed(cfg) && cfg.batch_size < k * dist::world_size())
    throw ConfigError("--batch-size " + std::to_string(cfg.batch_size) + " is smaller than the " +
                      std::to_string(k * dist::world_size()) + " devices of all processes: every device needs at least one example per minibatch");
  if (cfg.train_subset < 0 || cfg.test_subset < 0)
    throw ConfigError("bad --" + std::string(cfg.train_subset < 0 ? "train" : "test") + "-subset: expected a number > 0");
  if (cfg.balance && !cfg.split_weights.empty()) throw ConfigError("give --split-weights or --balance, not both");
  if (!cfg.split_weights.empty()) {
    if (static_cast<int64_t>(cfg.split_weights.size()) != k)
      throw ConfigError("bad --split-weights: " + std::to_string(cfg.split_weights.size()) + " weights for " +
                        std::to_string(k) + " devices");
    for (double w : cfg.split_weights)
      if (!(std::isfinite(w) && w > 0)) throw ConfigError("bad --split-weights: every weight must be a number > 0");
  }
  if (!cfg.threads.empty()) {
    if (cfg.threads.size() != 1 && static_cast<int64_t>(cfg.threads.size()) != k)
      throw ConfigError("bad --threads: give one count for every device or one per device (" + std::to_string(k) + ")");
    for (int t : cfg.threads)
      if (t < 1 || t > num_cores())
        throw ConfigError("bad --threads " + std::to_string(t) + ": expected 1 to " + std::to_string(num_cores()) +
                          " (the cores this process may use)");
  }
  harness::check_outputs({{"--save-params", cfg.save_params}, {"--checkpoint", cfg.checkpoint}});
  if (!cfg.resume.empty()) harness::check_readable("--resume", cfg.resume);
}

bool distributed(const Config& cfg) { return cfg.kvstore == "dist_sync" || cfg.kvstore == "dist_sync_ring"; }

namespace {
const Config& validated(const Config& cfg) {
  validate(cfg);
  return cfg;
}
}  // namespace

Run::Run(const Config& c)
    : cfg(validated(c)),
      budget(cfg.devices, cfg.threads),
      // train_iter, test_iter = gb.load_data_fashion_mnist(batch_size) (the data set: load_data)
      train_iter(load_data(cfg, true), cfg.batch_size, true, cfg.seed),
      test_iter(load_data(cfg, false), cfg.batch_size, false) {
  const std::vector<Device>& devices = cfg.devices;
  check_interrupt();  // loading takes well under a second; a signal meanwhile stops here
  // kvstore dist_sync: the processes of mpirun train together. Each reads only its devices' shards of
  // every minibatch and evaluates its share of the test set; rank 0 alone prints and writes files.
  dist = distributed(cfg) && dist::world_size() > 1;
  const int W = dist ? dist::world_size() : 1;
  rank = dist ? dist::rank() : 0;
  speak = cfg.verbose && rank == 0;
  if (dist) {
    const auto local = static_cast<int64_t>(devices.size());
    // The flags as given (cfg.flags), then what follows from them and from each rank's machine and data.
    dist::Fingerprint mine{{"program", "multi_gpu_concise"}};
    mine.insert(mine.end(), cfg.flags.begin(), cfg.flags.end());
    mine.insert(mine.end(), {{"model", cfg.model}, {"sync_bn", std::to_string(cfg.sync_bn)},
                             {"devices per process", std::to_string(local)}, {"batch_size", std::to_string(cfg.batch_size)},
                             {"lr", std::to_string(cfg.lr)}, {"num_epochs", std::to_string(cfg.num_epochs)},
                             {"seed", std::to_string(cfg.seed)}, {"kvstore", cfg.kvstore}, {"bucket_mb", std::to_string(cfg.bucket_mb)},
                             {"split weights", list(cfg.split_weights) + (cfg.balance ? " balance" : "")},
                             {"training examples", std::to_string(train_iter.size())},
                             {"test examples", std::to_string(test_iter.size())}, {"resuming", cfg.resume.empty() ? "no" : "yes"}});
    harness::join_processes(mine, train_iter, test_iter, local);  // then only this rank's shards
  }
  if (speak) {
    std::printf("running on: %s%s\n", str(devices).c_str(), W > 1 ? (" in each of " + std::to_string(W) + " processes").c_str() : "");
    std::printf("%s%s, batch %lld, lr %g, kvstore %s, %lld training and %lld test images\n", model_name(cfg.model).c_str(),
                cfg.sync_bn ? " with SyncBatchNorm" : "", (long long)cfg.batch_size, static_cast<double>(cfg.lr),
                cfg.kvstore.c_str(), (long long)train_iter.size(), (long long)test_iter.size());
    std::fflush(stdout);
  }
  if (cfg.balance && dist) throw ConfigError("--balance measures this process's devices only: give --split-weights with --kvstore dist_sync");
  split_weights = cfg.balance ? measure_weights(cfg, train_iter) : cfg.split_weights;
}

Result Run::result() const {
  Result r;
  r.devices = cfg.devices;
  r.model = cfg.model;
  r.batch_size = cfg.batch_size;
  r.lr = cfg.lr;
  r.split_weights = split_weights;
  return r;
}

int Run::before_training(nn::Block& net, optim::Trainer& trainer) {
  const int start = harness::resume(cfg.resume, net, trainer, cfg.devices, cfg.num_epochs, cfg.verbose);
  if (dist && !cfg.resume.empty()) harness::check_same_checkpoint(start, net);
  if (dist) {
    // Shapes first (a forward pass of one image, evaluation mode: no statistics change), then every
    // rank takes rank 0's parameters and checks that it now holds the same bits.
    Batch one = train_iter.batch(train_iter.order(0), 0);
    NoGrad no_grad;
    TrainMode eval(false);
    Shape shape = one.shape;
    shape[0] = 1;
    const int64_t row = numel(shape);
    for (Device d : cfg.devices)
      net(Tensor::from_vector(std::vector<float>(one.X.begin(), one.X.begin() + row), shape, d));
    optim::broadcast_parameters(net.collect_params(), 0);
    // DDP's gradient buckets, built now that the shapes are known: the first step's backward already
    // launches their allreduces (chapter 4).
    if (cfg.bucket_mb >= 0) trainer.set_buckets({cfg.bucket_mb, "library", true, cfg.comm_type});
  }
  return start;
}

double Run::loss_over_processes(double loss_sum, nn::Block& net) {
  if (!dist) return loss_sum;
  loss_sum = dist::sum_over_ranks({loss_sum})[0];
  // BatchNorm's running statistics are per device and each rank saw other images: every rank takes
  // rank 0's at the end of an epoch (as DDP broadcasts buffers), so the evaluation and the
  // checkpoint see one net.
  optim::broadcast_parameters(net.collect_params(), 0, /*states_only=*/true);
  return loss_sum;
}

double Run::accuracy_over_processes(double acc) {
  if (!dist) return acc;  // dist_sync: each process evaluated its share of the test set; the correct counts summed
  const double n = static_cast<double>(test_iter.size());
  return dist::sum_over_ranks({std::round(acc * n)})[0] / n;
}

void Run::save_params(const nn::Block& net) {
  if (cfg.save_params.empty() || rank != 0) return;
  io::save_parameters(net, cfg.save_params);
  if (speak) std::printf("parameters saved to %s\n", cfg.save_params.c_str());
}

std::vector<HostValue> read_later(const std::vector<Tensor>& losses) {
  std::vector<HostValue> reads;
  for (const Tensor& l : losses) reads.push_back(d2l::read_later(l));
  return reads;
}

SavedResult evaluate_saved(const Config& cfg, const std::string& path) {
  harness::check_readable("--load-params", path);
  ArrayDataset test_set = load_data(cfg, false);
  std::shared_ptr<nn::Sequential> net = make_net(cfg.model, cfg.sync_bn);
  try {
    io::load_parameters(*net, path, cfg.devices);  // net.load_parameters(path, ctx=ctx)
  } catch (const std::exception& e) {
    throw ConfigError(std::string("bad --load-params file for --model ") + cfg.model + ": " + e.what());
  }
  check_interrupt();
  DataIter test_iter(std::move(test_set), cfg.batch_size, false);
  const std::vector<Device> on = cfg.eval_all_devices ? cfg.devices : std::vector<Device>{cfg.devices[0]};
  if (cfg.verbose) {
    std::printf("evaluating %s (--model %s) on %lld test images on %s\n", path.c_str(), cfg.model.c_str(),
                (long long)test_iter.size(), str(on).c_str());
    std::fflush(stdout);
  }
  return {evaluate_accuracy(test_iter, *net, on), test_iter.size()};
}

std::string plot_runs(const std::vector<Result>& runs, const std::string& path) {
  PlotSpec spec{"", "epoch", "test acc", {}};
  for (const Result& r : runs) {
    if (r.test_acc.empty()) continue;
    Series s{str(r.devices) + ", batch " + std::to_string(r.batch_size), {}, r.test_acc, {}};
    for (size_t e = 0; e < r.test_acc.size(); ++e) s.x.push_back(static_cast<double>(r.first_epoch) + static_cast<double>(e));
    spec.series.push_back(s);
    spec.title = model_name(r.model) + ": test accuracy per epoch";
    spec.title[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(spec.title[0])));
  }
  if (spec.series.empty()) return "no epochs to plot";
  return plot_png(spec, path);
}

}  // namespace d2l::concise
