// The book's train(num_gpus, batch_size, lr): parameters copied to every device, each minibatch
// trained on all of them, test accuracy after every epoch, plotted like the book's Animator.
#include <cmath>
#include <cstdio>
#include <optional>

#include "chapters/harness/harness.hpp"
#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/plot.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "datasets/fashion_mnist.hpp"
#include "datasets/synthetic.hpp"

namespace d2l::scratch {

namespace {
// An event on every device's compute stream, after the work enqueued so far.
std::vector<Event> record_events(const std::vector<Device>& devices) {
  std::vector<Event> events(devices.size());
  for (size_t d = 0; d < devices.size(); ++d) runtime(devices[d]).compute.record(events[d]);
  return events;
}
}  // namespace

void make_quick(Config& cfg) {
  cfg.train_data = make_image_classification(kQuick.train_images, kQuick.side, 10, cfg.seed + 1);
  cfg.test_data = make_image_classification(kQuick.test_images, kQuick.side, 10, cfg.seed + 2);
  cfg.batch_size = kQuick.batch_size;
  cfg.lr = kQuick.lr;
  cfg.num_epochs = kQuick.num_epochs;
}

Result train(const Config& cfg) {
  const auto& devices = cfg.devices;
  if (devices.empty()) throw ConfigError("no devices to train on");
  // With --dist the devices of every process train together: k in all, this process's are
  // shards [rank * local, (rank + 1) * local) of each minibatch.
  const int64_t local = static_cast<int64_t>(devices.size()), W = cfg.dist ? dist::world_size() : 1;
  const int64_t k = W * local;
  Result r;
  r.batch_size = cfg.scale_batch ? cfg.batch_size * k : cfg.batch_size;  // exercise 1
  r.lr = cfg.scale_lr ? cfg.lr * static_cast<float>(k) : cfg.lr;          // exercise 2
  if (r.batch_size < k)
    throw ConfigError("--batch-size " + std::to_string(r.batch_size) + " is smaller than the " + std::to_string(k) +
                      " devices" + (W > 1 ? " of all processes" : "") + ": every device needs at least one example per minibatch");
  if (cfg.allreduce != "naive" && cfg.allreduce != "ring")
    throw ConfigError("bad --allreduce '" + cfg.allreduce + "': expected naive or ring");
  if (cfg.dist) dist::check_algorithm("--dist-allreduce", cfg.dist_allreduce);
  const Activation activation = activation_by_name(cfg.activation);  // exercise 5

  // train_iter, test_iter = d2l.load_data_fashion_mnist(batch_size)
  std::optional<DataIter> train_iter, test_iter;
  if (cfg.train_data && cfg.test_data) {
    train_iter.emplace(*cfg.train_data, r.batch_size, true, cfg.seed);
    test_iter.emplace(*cfg.test_data, r.batch_size, false);
  } else {
    auto iters = load_data_fashion_mnist(r.batch_size, cfg.data_dir, cfg.seed);
    train_iter.emplace(iters.train_iter);
    test_iter.emplace(iters.test_iter);
    check_interrupt();  // loading takes well under a second; a signal meanwhile stops here
  }
  if (train_iter->size() == 0 || test_iter->size() == 0)
    throw DataError(std::string("the ") + (train_iter->size() == 0 ? "training" : "test") +
                    " set has no examples; nothing to " + (train_iter->size() == 0 ? "train on" : "evaluate"));
  const int rank = cfg.dist ? dist::rank() : 0;
  if (cfg.dist) {
    // Every rank must agree on what it trains, or a collective would wait forever: one line instead.
    // The flags as given (cfg.flags), then what follows from them and from each rank's machine and data.
    dist::Fingerprint mine{{"program", "multi_gpu_scratch"}};
    mine.insert(mine.end(), cfg.flags.begin(), cfg.flags.end());
    mine.insert(mine.end(), {{"devices per process", std::to_string(local)},
                             {"batch_size", std::to_string(r.batch_size)}, {"lr", std::to_string(r.lr)},
                             {"num_epochs", std::to_string(cfg.num_epochs)}, {"seed", std::to_string(cfg.seed)},
                             {"allreduce", cfg.allreduce}, {"dist_allreduce", cfg.dist_allreduce},
                             {"bucket_mb", std::to_string(cfg.bucket_mb)}, {"activation", cfg.activation},
                             {"training examples", std::to_string(train_iter->size())},
                             {"test examples", std::to_string(test_iter->size())}});
    harness::join_processes(mine, *train_iter, *test_iter, local);  // then only this rank's shards
  }

  // Copy model parameters to every device (with --dist: rank 0's, broadcast to every process).
  manual_seed(cfg.seed);
  std::vector<Tensor> params = init_params(devices[0]);
  if (cfg.dist) {
    for (auto& p : params) dist::broadcast(p, 0);
    dist::check_same_bits(params, "initial parameters");
  }
  std::vector<std::vector<Tensor>> device_params;
  for (auto d : devices) device_params.push_back(get_params(params, d));
  std::optional<dist::Buckets> buckets;  // --dist: DDP's buckets over every device's copy of each parameter
  if (cfg.dist && cfg.bucket_mb >= 0) {
    std::vector<std::vector<Tensor>> replicas(params.size());
    for (size_t j = 0; j < params.size(); ++j)
      for (auto& dp : device_params) replicas[j].push_back(dp[j]);
    buckets.emplace(replicas, dist::BucketOptions{cfg.bucket_mb, cfg.dist_allreduce, true});
  }
  std::vector<uint64_t> kernels_before;
  for (auto d : devices) kernels_before.push_back(runtime(d).kernels_run());

  // --precision fp16 (torch.cuda.amp.GradScaler's rule): the losses scaled, a step with an inf or
  // NaN in a summed gradient skipped (train_batch)
  optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});
  if (cfg.verbose && rank == 0 && cfg.autocast != DType::f32)
    std::printf("mixed precision: %s under autocast (the GEMMs and convolutions), float32 parameters%s\n",
                dtype_name(cfg.autocast), cfg.autocast == DType::f16 ? ", dynamic loss scaling" : "");
  double train_seconds = 0;
  int64_t steps = 0;
  for (int epoch = 0; epoch < cfg.num_epochs; ++epoch) {
    harness::Progress timer(epoch + 1, train_iter->num_batches(), cfg.verbose, harness::Progress::Style::count);
    std::vector<std::vector<Tensor>> losses;  // per step: the summed loss of every device with examples
    std::vector<bool> stepped;                // per step: taken (false: fp16's scaler skipped it)
    // At most two minibatches in flight: once minibatch i is enqueued, the host waits for i - 1 and
    // then enqueues i + 1 while the devices compute i.
    harness::InFlight<std::vector<Event>> flight(1, [](std::vector<Event>& events) {
      for (auto& e : events) e.synchronize();
    });
    for (const Batch& b : train_iter->epoch(epoch)) {
      check_interrupt();  // Ctrl-C: stop between minibatches (main() exits 130 after the devices finish)
      // Multi-device training on one minibatch.
      bool took = true;
      losses.push_back(train_batch(b, device_params, devices, r.lr, cfg.allreduce, cfg.dist ? cfg.dist_allreduce : "",
                                   buckets ? &*buckets : nullptr, activation, cfg.autocast, &scaler, &took));
      stepped.push_back(took);
      flight.wait_for_room();
      flight.push(record_events(devices));
      ++steps;
      timer.step();
    }
    flight.drain();
    waitall();
    train_seconds += timer.seconds();
    // A NaN or infinite loss stops training, naming its step. Checked once the epoch's work is done:
    // reading each step's loss at once would make the host wait for the devices every step.
    // (A step the loss scaler skipped may have overflowed in its forward: its loss is left out.)
    double loss_sum = 0;
    int64_t skipped = 0;
    for (size_t s = 0; s < losses.size(); ++s) {
      double step_loss = 0;
      for (auto& l : losses[s]) step_loss += l.item();
      skipped += !stepped[s];
      if (!stepped[s] && !std::isfinite(step_loss)) continue;
      check_loss(step_loss, epoch + 1, steps - static_cast<int64_t>(losses.size() - s) + 1);
      loss_sum += step_loss;
    }
    if (scaler.is_enabled()) {
      r.skipped_steps.push_back(skipped);
      r.loss_scale.push_back(scaler.get_scale());
      if (cfg.verbose && rank == 0)
        std::printf("loss scaling: %lld of %zu steps skipped (an inf or NaN in a gradient), scale now %g\n",
                    static_cast<long long>(skipped), losses.size(), static_cast<double>(scaler.get_scale()));
    }
    if (cfg.dist) loss_sum = dist::sum_over_ranks({loss_sum})[0];
    r.train_loss.push_back(loss_sum / static_cast<double>(train_iter->size()));
    // Evaluate the model on device 0 (or on all devices: exercise 4); with --dist each process its
    // share of the test set, the correct counts summed.
    double acc = evaluate_accuracy(*test_iter, device_params, devices, cfg.eval_all_devices, activation);
    if (cfg.dist) {
      const double n = static_cast<double>(test_iter->size());
      acc = dist::sum_over_ranks({std::round(acc * n)})[0] / n;
    }
    r.test_acc.push_back(acc);
    if (cfg.verbose)
      std::printf("epoch %d, loss %.3f, test acc %.2f, %.1f sec\n", epoch + 1, r.train_loss.back(), r.test_acc.back(),
                  train_seconds / (epoch + 1));
    std::fflush(stdout);
  }
  r.sec_per_epoch = train_seconds / std::max<size_t>(1, r.test_acc.size());
  for (size_t d = 0; d < devices.size(); ++d) {
    r.kernels_per_device.push_back(runtime(devices[d]).kernels_run() - kernels_before[d]);
    std::vector<std::vector<float>> values;
    for (auto& p : device_params[d]) values.push_back(p.to_vector());
    r.params.push_back(values);
  }
  if (cfg.verbose) {
    std::string where = str(devices);
    if (W > 1) where += " in each of " + std::to_string(W) + " processes";
    std::printf("test acc: %.2f, %.1f sec/epoch on %s\n", r.test_acc.back(), r.sec_per_epoch, where.c_str());
  }

  if (!cfg.plot.empty() && rank == 0) {  // one voice: rank 0 plots  // the book's Animator('epoch', 'test acc', xlim=[1, num_epochs])
    Series s;
    s.name = "test acc";
    s.y = r.test_acc;
    for (size_t e = 0; e < r.test_acc.size(); ++e) s.x.push_back(static_cast<double>(e + 1));
    PlotSpec spec{"LeNet on " + str(devices) + ", batch " + std::to_string(r.batch_size), "epoch", "test acc", {s}};
    std::string err = plot_png(spec, cfg.plot);
    // No gnuplot is a note (the plot is optional); a plot that could not be written is an error.
    if (!err.empty() && err.rfind("gnuplot not found", 0) != 0) throw std::runtime_error("--plot: " + err);
    if (cfg.verbose) std::printf("%s\n", err.empty() ? ("plot: " + cfg.plot).c_str() : ("note: " + err).c_str());
  }
  return r;
}

}  // namespace d2l::scratch
