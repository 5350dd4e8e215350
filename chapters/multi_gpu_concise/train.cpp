// The book's train(num_gpus, batch_size, lr) (book/000 "Multi-GPU Model Training"): the net
// initialised on every device, a Trainer that sums the replicas' gradients, each minibatch split
// over the devices, the training time and test accuracy after every epoch. Beside it: checkpoints,
// the exercise's uneven split, and evaluating a saved net.
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <deque>
#include <cmath>
#include <cstdio>

#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/copy.hpp"
#include "core/io/checkpoint.hpp"
#include "core/io/parameters_file.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/optim/kvstore.hpp"
#include "core/autograd.hpp"
#include "core/plot.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

namespace d2l::concise {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The progress line during an epoch, on stderr: rewritten in place on a terminal (every 5
// minibatches, erased at the end); in a log, a line at every tenth of an epoch of 20+ minibatches.
void progress(int epoch, int64_t done, int64_t total, double sec) {
  static const bool terminal = isatty(2);
  if (terminal && (done % 5 == 0 || done == total)) {
    std::fprintf(stderr, "\repoch %d: %lld/%lld minibatches, %.1f sec", epoch, (long long)done, (long long)total, sec);
    if (done == total) std::fprintf(stderr, "\r%*s\r", 60, "");
  } else if (!terminal && total >= 20 && done < total && done % ((total + 9) / 10) == 0) {
    std::fprintf(stderr, "epoch %d: %lld/%lld minibatches, %.1f sec\n", epoch, (long long)done, (long long)total, sec);
  }
  std::fflush(stderr);
}

// Per-device kernel threads for one run (--threads), the previous budget restored afterwards.
class ThreadBudget {
 public:
  ThreadBudget(const std::vector<Device>& devices, const std::vector<int>& threads) {
    for (size_t i = 0; i < devices.size() && !threads.empty(); ++i) {
      if (devices[i].kind == DeviceKind::gpu) continue;  // a GPU's kernels have no CPU threads
      DeviceRuntime& rt = runtime(devices[i]);
      saved_.emplace_back(devices[i], rt.threads());
      rt.set_threads(threads.size() == 1 ? threads[0] : threads[i]);
    }
  }
  ~ThreadBudget() {
    for (auto& [d, t] : saved_) runtime(d).set_threads(t);
  }
  ThreadBudget(const ThreadBudget&) = delete;
  ThreadBudget& operator=(const ThreadBudget&) = delete;

 private:
  std::vector<std::pair<Device, int>> saved_;
};

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

void check_readable(const char* flag, const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) throw ConfigError(std::string("bad ") + flag + " '" + path + "': no such file");
  if (!S_ISREG(st.st_mode)) throw ConfigError(std::string("bad ") + flag + " '" + path + "': not a regular file");
  if (::access(path.c_str(), R_OK) != 0) throw ConfigError(std::string("bad ") + flag + " '" + path + "': not readable");
}

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
  check_output_path("--save-params", cfg.save_params);
  check_output_path("--checkpoint", cfg.checkpoint);
  if (!cfg.resume.empty()) check_readable("--resume", cfg.resume);
}

bool distributed(const Config& cfg) { return cfg.kvstore == "dist_sync" || cfg.kvstore == "dist_sync_ring"; }

Result train(const Config& cfg) {
  validate(cfg);
  const std::vector<Device>& devices = cfg.devices;
  ThreadBudget budget(devices, cfg.threads);
  // train_iter, test_iter = gb.load_data_fashion_mnist(batch_size)
  DataIter train_iter(load_data(cfg, true), cfg.batch_size, true, cfg.seed);
  DataIter test_iter(load_data(cfg, false), cfg.batch_size, false);
  check_interrupt();  // loading takes well under a second; a signal meanwhile stops here
  // kvstore dist_sync: the processes of mpirun train together. Each reads only its devices' shards of
  // every minibatch and evaluates its share of the test set; rank 0 alone prints and writes files.
  const bool dist = distributed(cfg) && dist::world_size() > 1;
  const int W = dist ? dist::world_size() : 1, rank = dist ? dist::rank() : 0;
  const bool speak = cfg.verbose && rank == 0;
  if (dist) {
    const auto local = static_cast<int64_t>(devices.size());
    dist::check_same_config({{"program", "multi_gpu_concise"}, {"model", cfg.model}, {"sync_bn", std::to_string(cfg.sync_bn)},
                             {"devices per process", std::to_string(local)}, {"batch_size", std::to_string(cfg.batch_size)},
                             {"lr", std::to_string(cfg.lr)}, {"num_epochs", std::to_string(cfg.num_epochs)},
                             {"seed", std::to_string(cfg.seed)}, {"kvstore", cfg.kvstore},
                             {"split weights", list(cfg.split_weights) + (cfg.balance ? " balance" : "")},
                             {"training examples", std::to_string(train_iter.size())},
                             {"test examples", std::to_string(test_iter.size())}, {"resume", cfg.resume}});
    train_iter.shard(W * local, rank * local, (rank + 1) * local);
    test_iter.shard(W, rank, rank + 1);
  }
  Result r;
  r.devices = devices;
  r.model = cfg.model;
  r.batch_size = cfg.batch_size;
  r.lr = cfg.lr;
  if (speak) {
    std::printf("running on: %s%s\n", str(devices).c_str(), W > 1 ? (" in each of " + std::to_string(W) + " processes").c_str() : "");
    std::printf("%s%s, batch %lld, lr %g, kvstore %s, %lld training and %lld test images\n", model_name(cfg.model).c_str(),
                cfg.sync_bn ? " with SyncBatchNorm" : "", (long long)cfg.batch_size, static_cast<double>(cfg.lr),
                cfg.kvstore.c_str(), (long long)train_iter.size(), (long long)test_iter.size());
    std::fflush(stdout);
  }
  if (cfg.balance && dist) throw ConfigError("--balance measures this process's devices only: give --split-weights with --kvstore dist_sync");
  r.split_weights = cfg.balance ? measure_weights(cfg, train_iter) : cfg.split_weights;

  // net.initialize(init=init.Normal(sigma=0.01), ctx=ctx, force_reinit=True)
  manual_seed(cfg.seed);
  r.net = make_net(cfg.model, cfg.sync_bn);
  r.net->initialize(default_init(cfg.model), devices, /*force_reinit=*/true);
  // trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': lr})
  optim::Trainer trainer(r.net->collect_params(), "sgd", {cfg.lr}, cfg.kvstore);
  // dist_sync: DDP's gradient buckets, their allreduces launched during backward (chapter 4).
  if (dist && cfg.bucket_mb >= 0) trainer.kvstore().set_buckets({cfg.bucket_mb, "library", true});
  int start = 0;
  if (!cfg.resume.empty()) {
    try {
      start = static_cast<int>(io::load_checkpoint(cfg.resume, *r.net, trainer, devices));
    } catch (const std::exception& e) {
      throw ConfigError(std::string("bad --resume checkpoint: ") + e.what());
    }
    check_interrupt();
    if (cfg.verbose)
      std::printf("resumed from %s after epoch %d%s\n", cfg.resume.c_str(), start,
                  start >= cfg.num_epochs ? ": nothing left to train (--num-epochs)" : "");
  }
  r.first_epoch = start + 1;
  if (dist) {
    // Shapes first (a forward pass of one image, evaluation mode: no statistics change), then every
    // rank takes rank 0's parameters and checks that it now holds the same bits.
    Batch one = train_iter.batch(train_iter.order(0), 0);
    NoGrad no_grad;
    TrainMode eval(false);
    Shape shape = one.shape;
    shape[0] = 1;
    const int64_t row = numel(shape);
    for (Device d : devices)
      (*r.net)(Tensor::from_vector(std::vector<float>(one.X.begin(), one.X.begin() + row), shape, d));
    optim::broadcast_parameters(r.net->collect_params(), 0);
  }

  for (int epoch = start; epoch < cfg.num_epochs; ++epoch) {
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> losses;
    int64_t i = 0, checked = 0, total = train_iter.num_batches();
    // Minibatches in flight (--in-flight, default 2): before enqueueing minibatch i the host waits
    // for minibatch i - in_flight and checks its loss, read in stream order right after its update;
    // the later ones keep the devices busy meanwhile. The caching allocator reuses memory in stream
    // order (core/allocator.hpp), so a second minibatch in flight takes little more memory.
    std::deque<std::vector<HostValue>> flight;  // per minibatch in flight: its losses, read later
    auto check_oldest = [&] {
      double step_loss = 0;
      for (auto& v : flight.front()) step_loss += v.value();
      flight.pop_front();
      check_loss(step_loss, epoch + 1, ++checked);  // NaN or infinite: stop, naming the epoch and step
    };
    for (const Batch& b : train_iter.epoch(epoch)) {
      while (flight.size() >= static_cast<size_t>(cfg.in_flight)) check_oldest();
      check_interrupt();  // Ctrl-C / SIGTERM: stop between minibatches (the last checkpoint stays)
      std::vector<HostValue> reads;
      for (auto& l : train_batch(b, *r.net, trainer, devices, r.split_weights)) {
        losses.push_back(l);
        reads.push_back(read_later(l));
      }
      flight.push_back(std::move(reads));
      ++i;
      if (speak) progress(epoch + 1, i, total, seconds_since(t0));
    }
    while (!flight.empty()) check_oldest();
    waitall();  // nd.waitall()
    r.train_seconds.push_back(seconds_since(t0));
    double loss_sum = 0;
    for (auto& l : losses) loss_sum += l.item();
    check_loss(loss_sum, epoch + 1, total);
    if (dist) {
      loss_sum = dist::sum_over_ranks({loss_sum})[0];
      // BatchNorm's running statistics are per device and each rank saw other images: every rank
      // takes rank 0's at the end of an epoch (as DDP broadcasts buffers), so the evaluation and the
      // checkpoint see one net.
      optim::broadcast_parameters(r.net->collect_params(), 0, /*states_only=*/true);
    }
    r.train_loss.push_back(loss_sum / static_cast<double>(train_iter.size()));
    // test_acc = gb.evaluate_accuracy(test_iter, net, ctx[0]), or on every device (with dist_sync:
    // each process its share of the test set, the correct counts summed)
    double acc = evaluate_accuracy(test_iter, *r.net, cfg.eval_all_devices ? devices : std::vector<Device>{devices[0]});
    if (dist) {
      const double n = static_cast<double>(test_iter.size());
      acc = dist::sum_over_ranks({std::round(acc * n)})[0] / n;
    }
    r.test_acc.push_back(acc);
    if (speak)
      std::printf("epoch %d, training time: %.1f sec, test_acc %.2f\n", epoch + 1, r.train_seconds.back(), r.test_acc.back());
    std::fflush(stdout);
    if (!cfg.checkpoint.empty() && rank == 0) io::save_checkpoint(cfg.checkpoint, *r.net, trainer, epoch + 1);
  }
  if (!cfg.save_params.empty() && rank == 0) {
    io::save_parameters(*r.net, cfg.save_params);
    if (speak) std::printf("parameters saved to %s\n", cfg.save_params.c_str());
  }
  return r;
}

SavedResult evaluate_saved(const Config& cfg, const std::string& path) {
  check_readable("--load-params", path);
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
