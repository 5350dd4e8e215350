// Chapter 2 (concise multi-GPU training): it learns, data parallelism with the Trainer on k devices
// computes what one device computes for every kvstore, SyncBatchNorm equals BatchNorm on the whole
// batch while plain BatchNorm keeps each device's statistics, checkpoints resume bit for bit, saved
// nets evaluate the same, the cells print what the book prints, and bad input is one clear error.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "chapters/harness/harness.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/autograd.hpp"
#include "core/checkpoint/parameters_file.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"
#include "tests/first_devices.hpp"
#include "tests/small_run.hpp"

using namespace d2l;
using concise::Config;
using concise::Result;

namespace {

std::vector<Device> cpus(int n) { return test::first_devices(n); }

// The lab's CNN, 20 steps of batch 10 on generated 28x28 images (1 epoch of 200): small enough for TSan.
Config lab_small(int devices) {
  Config c = test::small_run<Config>(cpus(devices), {.train_images = 200, .test_images = 40, .image_size = 28,
                                                     .data_seed = 11, .batch_size = 10, .lr = 0.3f, .seed = 3});
  c.model = "lab-cnn";
  return c;
}

// ResNet-18 on generated 1x12x12 images (12 -> 6 -> 3 -> 2 through the stages), batch 8.
Config resnet_tiny(int devices, int64_t images = 16) {
  Config c = test::small_run<Config>(cpus(devices), {.train_images = images, .test_images = 16, .image_size = 12,
                                                     .data_seed = 21, .batch_size = 8, .lr = 0.05f, .seed = 5});
  c.model = "resnet18";
  return c;
}

// Every parameter (running statistics included) of replica `device`, by name.
std::vector<std::pair<std::string, std::vector<float>>> values(const Result& r, Device device) {
  std::vector<std::pair<std::string, std::vector<float>>> out;
  for (auto& [name, p] : r.net->collect_params()) out.emplace_back(name, p->data(device).to_vector());
  return out;
}

// Largest relative difference over the parameters, per tensor: |a - b| / max(|a|, 1e-3) (2-norms).
// The floor: a conv bias followed by BatchNorm gets no gradient (the normalisation removes it), so it
// holds its zero initial value plus rounding noise, whose relative difference means nothing.
double max_rel_diff(const std::vector<std::pair<std::string, std::vector<float>>>& a,
                    const std::vector<std::pair<std::string, std::vector<float>>>& b, std::string* worst_name = nullptr) {
  double worst = 0;
  REQUIRE(a.size() == b.size());
  for (size_t t = 0; t < a.size(); ++t) {
    REQUIRE(a[t].first == b[t].first);
    double diff = 0, norm = 0;
    for (size_t i = 0; i < a[t].second.size(); ++i) {
      double d = double(a[t].second[i]) - b[t].second[i];
      diff += d * d;
      norm += double(a[t].second[i]) * a[t].second[i];
    }
    double rel = std::sqrt(diff) / std::max(std::sqrt(norm), 1e-3);
    if (rel > worst && worst_name) *worst_name = a[t].first;
    worst = std::max(worst, rel);
  }
  return worst;
}

// The same over all parameters at once: |a - b| / |a| of everything (2-norms).
double global_rel_diff(const std::vector<std::pair<std::string, std::vector<float>>>& a,
                       const std::vector<std::pair<std::string, std::vector<float>>>& b) {
  double diff = 0, norm = 0;
  for (size_t t = 0; t < a.size(); ++t)
    for (size_t i = 0; i < a[t].second.size(); ++i) {
      double d = double(a[t].second[i]) - b[t].second[i];
      diff += d * d;
      norm += double(a[t].second[i]) * a[t].second[i];
    }
  return std::sqrt(diff / norm);
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("d2l_concise_" + name)).string();
}

}  // namespace

TEST_CASE("quick run of the lab's CNN on 2 CPU devices: held-out accuracy >= 0.9") {
  Config c;
  c.model = "lab-cnn";
  c.devices = cpus(2);
  concise::make_quick(c);  // 4000 + 1000 generated 28x28 images, batch 128, lr 0.3
  c.num_epochs = 2;
  c.verbose = false;
  Result r = concise::train(c);
  MESSAGE("test acc per epoch: " << r.test_acc[0] << ", " << r.test_acc[1] << "; loss " << r.train_loss[0] << " -> "
                                 << r.train_loss[1]);
  CHECK(r.test_acc.back() >= 0.9);  // chance is 0.1
  CHECK(r.train_loss.back() < r.train_loss.front());
}

TEST_CASE("quick run in bf16 and fp16: the lab's CNN trained under autocast reaches the float32 run's accuracy") {
  std::vector<Result> runs;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    Config c;
    c.model = "lab-cnn";
    c.devices = cpus(2);
    concise::make_quick(c);
    c.lr = 0.1f;  // the quick recipe's 0.3 is at the edge of stability: there a bfloat16 run can lose every ReLU
    c.num_epochs = 2;
    c.verbose = false;
    c.autocast = t;
    runs.push_back(concise::train(c));
  }
  MESSAGE("test acc float32 " << runs[0].test_acc.back() << ", bfloat16 " << runs[1].test_acc.back() << ", float16 "
                              << runs[2].test_acc.back() << "; loss " << runs[0].train_loss[0] << "/" << runs[1].train_loss[0]
                              << "/" << runs[2].train_loss[0] << " then " << runs[0].train_loss.back() << ", "
                              << runs[1].train_loss.back() << ", " << runs[2].train_loss.back() << "; float16 steps skipped "
                              << runs[2].skipped_steps[0] << " + " << runs[2].skipped_steps[1] << ", scale "
                              << runs[2].loss_scale.back());
  for (size_t i : {1, 2}) {
    CAPTURE(i);
    CHECK(runs[i].test_acc.back() >= runs[0].test_acc.back() - 0.02);
    // float16's skipped steps (7 of 62 here) learn nothing: its loss trails a little more
    CHECK(std::fabs(runs[i].train_loss.back() - runs[0].train_loss.back()) <= (i == 1 ? 0.1 : 0.2) * runs[0].train_loss.front());
    // The runs differ: the 16-bit ones did round (their parameters are not the float32 run's).
    CHECK(concise::trained_values(runs[0]) != concise::trained_values(runs[i]));
    // The parameters stayed float32 (master weights).
    for (auto& [name, p] : runs[i].net->collect_params()) CHECK(p->data(cpus(2)[0]).dtype() == DType::f32);
  }
  // float16 ran under a GradScaler: a scale a power of two, halved once for every skipped step it
  // did not double back (2000 clean steps are more than these 2 epochs have).
  CHECK(runs[1].skipped_steps.empty());
  REQUIRE(runs[2].skipped_steps.size() == 2);
  const int64_t skipped = runs[2].skipped_steps[0] + runs[2].skipped_steps[1];
  // The loss is summed over each device's 64 examples (MXNet's l.backward()): at 2^16 the first
  // steps' float16 gradient GEMMs overflow, and the scaler backs off.
  CHECK(skipped >= 1);
  CHECK(runs[2].loss_scale.back() == std::ldexp(65536.0f, -static_cast<int>(skipped)));
}

namespace {
// The quick lab CNN trained with 1 and then 2 minibatches in flight; peaks: cpu(0)'s peak bytes above
// what was in use before each.
std::vector<Result> in_flight_runs(std::vector<int64_t>& peaks) {
  std::vector<Result> runs;
  for (int in_flight : {1, 2}) {
    Config c;
    c.model = "lab-cnn";
    c.devices = cpus(2);
    concise::make_quick(c);
    c.num_epochs = 1;
    c.verbose = false;
    c.in_flight = in_flight;
    waitall();
    for (Device d : c.devices) runtime(d).allocator->reset_peak();
    const int64_t before = runtime(c.devices[0]).allocator->stats().in_use;
    runs.push_back(concise::train(c));
    peaks.push_back(runtime(c.devices[0]).allocator->stats().peak - before);
  }
  return runs;
}
}  // namespace

TEST_CASE("two minibatches in flight: the same training, bit for bit") {
  std::vector<int64_t> peaks;
  auto runs = in_flight_runs(peaks);
  CHECK(runs[0].train_loss == runs[1].train_loss);
  CHECK(runs[0].test_acc == runs[1].test_acc);
  CHECK(max_rel_diff(values(runs[0], cpu(0)), values(runs[1], cpu(0))) == 0.0);
}

// A peak depends on when the device threads free what the host queued: suite timing (the plain run).
TEST_CASE("two minibatches in flight: little more memory than one") {
  std::vector<int64_t> peaks;
  in_flight_runs(peaks);
  MESSAGE("peak bytes on cpu(0) above what was in use: 1 in flight " << peaks[0] << ", 2 in flight " << peaks[1]);
  CHECK(peaks[1] < 1.25 * static_cast<double>(peaks[0]));  // not the double a second step's own memory would be
}

TEST_CASE("the lab's CNN: 2 and 3 devices give the parameters of 1 device after 20 steps, for each kvstore") {
  Result one = concise::train(lab_small(1));
  for (std::string kv : {"device", "local", "ring"}) {
    for (int k : {2, 3}) {  // batch 10: shards 5/5 and 4/3/3
      CAPTURE(kv);
      CAPTURE(k);
      Config c = lab_small(k);
      c.kvstore = kv;
      Result r = concise::train(c);
      std::string worst;
      double rel = max_rel_diff(values(one, cpu(0)), values(r, cpu(0)), &worst);
      MESSAGE("kvstore " << kv << ", " << k << " devices: largest relative difference " << rel << " (" << worst << ")");
      CHECK(rel < 1e-5);
      for (int d = 1; d < k; ++d) CHECK(values(r, cpu(d)) == values(r, cpu(0)));  // every replica the same bits
    }
  }
  // Not equal by accident: the 19 steps after the first moved the parameters far beyond the tolerance.
  Config first_step = lab_small(1);
  first_step.train_subset = 10;
  CHECK(max_rel_diff(values(concise::train(first_step), cpu(0)), values(one, cpu(0))) > 1e-2);
}

TEST_CASE("--conv direct, winograd, blocked and auto train the nets of --conv im2col: the lab's CNN (20 steps) and ResNet-18 (2 steps)") {
  // The members of the CPU convolution family compute the same sums in another order (Winograd's
  // transforms round more): losses, parameters and accuracy agree within float rounding, carried
  // through the steps.
  harness::Conv conv;
  auto with = [&](const std::string& name, const Config& c) {
    conv.name = name;
    conv.apply();
    return concise::train(c);
  };
  for (const Config& c : {lab_small(2), resnet_tiny(2)}) {
    CAPTURE(c.model);
    Result im2col = with("im2col", c);
    for (std::string member : {"direct", "winograd", "blocked", "auto"}) {
      CAPTURE(member);
      Result other = with(member, c);
      std::string worst;
      const double rel = max_rel_diff(values(other, cpu(0)), values(im2col, cpu(0)), &worst);
      MESSAGE(c.model << ", " << member << ": largest relative difference of a parameter " << rel << " (" << worst
                      << "); loss " << other.train_loss[0] << " vs " << im2col.train_loss[0]);
      // Measured: lab-cnn 2.8e-6 (direct), 1.1e-6 (winograd); resnet18 8.6e-5 (direct: the stem conv's
      // bias, which BatchNorm leaves without a gradient, holds rounding noise only; see max_rel_diff's
      // floor), 1.7e-2 (winograd: layer4's BatchNorm bias, whose gradient sums few values of a 1x1 map
      // normalised over 2 images, so F(4x4, 3x3)'s rounding of ~1e-5 grows there), 1.1e-3 (blocked:
      // 3.0.bn1.bias, the same few-value sums). auto: the members it picks on this machine (blocked
      // beside an SSE OpenBLAS, else im2col for these small images).
      CHECK(rel < (c.model == "lab-cnn" ? 2e-5 : member == "winograd" ? 1e-1 : 1e-2));
      CHECK(std::abs(other.train_loss[0] - im2col.train_loss[0]) <= 1e-5 * std::abs(im2col.train_loss[0]));
      CHECK(other.test_acc == im2col.test_acc);
    }
    // Not equal by accident: training moved the parameters far beyond the tolerance.
    Config none = c;
    none.train_subset = c.batch_size;
    CHECK(max_rel_diff(values(concise::train(none), cpu(0)), values(im2col, cpu(0))) > 1e-3);
  }
  conv.name = "auto";  // the default
  conv.apply();
}

// The lab's CNN behind a block that notes how many rows each device's shard had: what each replica saw.
struct RowsSeen : nn::Block {
  std::shared_ptr<nn::Sequential> net = register_child("net", concise::lab_cnn());
  std::vector<std::pair<Device, int64_t>> rows;  // per forward, per device
  std::vector<Tensor> forward_shards(const std::vector<Tensor>& xs) override {
    for (auto& x : xs) rows.push_back({x.device(), x.dim(0)});
    return (*net)(xs);
  }
  std::string type() const override { return "RowsSeen"; }
};

TEST_CASE("exercise 2: uneven shards (split weights 3:1) train the same model as even ones") {
  Result one = concise::train(lab_small(1));
  Config c = lab_small(2);
  c.split_weights = {3, 1};  // batch 10 -> shards 8 and 2
  Result r = concise::train(c);
  CHECK(max_rel_diff(values(one, cpu(0)), values(r, cpu(0))) < 1e-5);
  // What each device received from train_batch: a minibatch of 12 becomes 9 rows on cpu(0) and 3 on
  // cpu(1) with weights 3:1, and the other way round with 1:3.
  const auto devs = cpus(2);
  RowsSeen net;
  net.initialize(concise::default_init("lab-cnn"), devs);
  optim::Trainer trainer(net.collect_params(), "sgd", {0.1f});
  DataIter batches(make_image_classification(24, 28, 10, 13), 12, false);
  int64_t i = 0;
  for (const Batch& b : batches.epoch(0))
    concise::train_batch(b, net, trainer, devs, i++ == 0 ? std::vector<double>{3, 1} : std::vector<double>{1, 3});
  using Seen = std::vector<std::pair<Device, int64_t>>;
  CHECK(net.rows == Seen{{cpu(0), 9}, {cpu(1), 3}, {cpu(0), 3}, {cpu(1), 9}});
}

TEST_CASE("ResNet-18 with SyncBatchNorm on 2 devices equals 1 device with the whole batch") {
  // One step (batch 8 of 12x12 images): every parameter and running statistic as on one device.
  // The convolutions run kernel4 (blocked), which sums each weight-gradient value over the images
  // and positions in one order: 8 images on one device and 4 + 4 on two then differ by the
  // allreduce's rounding only. auto would pick Winograd for 8 images and im2col for 4 here, and
  // im2col groups the images in chunks by the batch: rounding that BatchNorm's backward amplifies
  // (2e-5 instead of 1e-7 after one step), whatever the GEMM.
  harness::Conv conv;
  conv.name = "blocked";
  conv.apply();
  Config c = resnet_tiny(1);
  c.train_subset = 8;
  Result one = concise::train(c);
  c.devices = cpus(2);
  c.sync_bn = true;
  Result synced = concise::train(c);
  c.sync_bn = false;
  Result apart = concise::train(c);  // per-device BatchNorm: each shard normalised on its own
  const auto want = values(one, cpu(0)), got = values(synced, cpu(0));
  for (size_t t = 0; t < want.size(); ++t) {
    const auto& [name, a] = want[t];
    const auto& b = got[t].second;
    CAPTURE(name);
    // A conv followed by BatchNorm gets no gradient (the normalisation removes its bias): its bias
    // stays at its zero initial value up to rounding, on both sides.
    const bool bias_before_bn = name == "0.bias" || name.find("conv1.bias") != std::string::npos ||
                                name.find("conv2.bias") != std::string::npos;
    if (bias_before_bn) {
      for (size_t i = 0; i < a.size(); ++i) CHECK(std::fabs(b[i]) <= 1e-6 + 1e-3 * std::fabs(a[i]));
      continue;
    }
    CHECK(max_rel_diff({{name, a}}, {{name, b}}) < 1e-5);
  }
  CHECK(values(synced, cpu(1)) == values(synced, cpu(0)));  // running statistics too: every replica the same
  double same = global_rel_diff(want, got);
  double different = global_rel_diff(values(one, cpu(0)), values(apart, cpu(0)));
  MESSAGE("after one step, relative to 1 device: SyncBatchNorm " << same << ", per-device BatchNorm " << different);
  CHECK(same < 1e-6);
  CHECK(different > 1e-3);
  // A second step. BatchNorm on batches of 4-8 makes this small net sensitive: the rounding
  // differences of one step (1e-7) grow by 1e3-1e5 in the next, how much depending on the order of
  // the sums (1e-2 with some). So the second step is judged against the
  // per-device model, which is wrong by design: SyncBatchNorm must stay closer to one device (the
  // exact check is the first step's above).
  c.train_subset = 16;
  c.devices = cpus(1);
  Result one2 = concise::train(c);
  c.devices = cpus(2);
  c.sync_bn = true;
  Result synced2 = concise::train(c);
  c.sync_bn = false;
  Result apart2 = concise::train(c);
  const double same2 = global_rel_diff(values(one2, cpu(0)), values(synced2, cpu(0)));
  const double different2 = global_rel_diff(values(one2, cpu(0)), values(apart2, cpu(0)));
  MESSAGE("after two steps, relative to 1 device: SyncBatchNorm " << same2 << ", per-device BatchNorm " << different2);
  CHECK(synced2.train_loss[0] == doctest::Approx(one2.train_loss[0]).epsilon(1e-3));
  CHECK(same2 < 0.5 * different2);
  conv.name = "auto";
  conv.apply();
}

TEST_CASE("per-device BatchNorm: each replica's running statistics are those of its own shard") {
  // One forward_backward of ResNet-18 on 4 images 1x8x8 over [cpu(0), cpu(1)]; the stem's BatchNorm
  // ("1") must have updated replica d with the statistics of conv0(shard d), computed here in double.
  auto devices = cpus(2);
  for (bool sync : {false, true}) {
    CAPTURE(sync);
    auto net = concise::resnet18(10, sync);
    net->initialize(Init::Normal(0.05f), devices);
    std::vector<float> x = make_image_classification(4, 8, 10, 7).features;
    std::vector<int32_t> labels{1, 2, 3, 4};
    auto X = nn::split_and_load(x, {4, 1, 8, 8}, devices);
    auto y = nn::split_and_load(labels, {4}, devices);
    concise::forward_backward(*net, X, y);
    auto params = net->collect_params();
    std::vector<float> w = params["0.weight"].data(cpu(0)).to_vector(), b = params["0.bias"].data(cpu(0)).to_vector();
    // conv 64@3x3, padding 1, of images [lo, hi): per channel mean and unbiased variance
    auto stats = [&](int lo, int hi, int c) {
      std::vector<double> v;
      for (int n = lo; n < hi; ++n)
        for (int i = 0; i < 8; ++i)
          for (int j = 0; j < 8; ++j) {
            double acc = b[c];
            for (int ki = 0; ki < 3; ++ki)
              for (int kj = 0; kj < 3; ++kj) {
                int ii = i + ki - 1, jj = j + kj - 1;
                if (ii >= 0 && ii < 8 && jj >= 0 && jj < 8) acc += double(w[c * 9 + ki * 3 + kj]) * x[n * 64 + ii * 8 + jj];
              }
            v.push_back(acc);
          }
      double mean = 0, var = 0;
      for (double a : v) mean += a;
      mean /= double(v.size());
      for (double a : v) var += (a - mean) * (a - mean);
      return std::pair{mean, var / double(v.size() - 1)};
    };
    for (int d = 0; d < 2; ++d) {
      std::vector<float> rm = params["1.running_mean"].data(cpu(d)).to_vector(),
                         rv = params["1.running_var"].data(cpu(d)).to_vector();
      for (int c = 0; c < 64; ++c) {
        auto [mean, var] = sync ? stats(0, 4, c) : stats(2 * d, 2 * d + 2, c);  // shard d = images 2d, 2d+1
        CHECK(std::fabs(rm[c] - 0.1 * mean) <= 1e-5 + 1e-4 * std::fabs(0.1 * mean));
        CHECK(std::fabs(rv[c] - (0.9 + 0.1 * var)) <= 1e-5 + 1e-4 * (0.9 + 0.1 * var));
      }
    }
    auto rm0 = params["1.running_mean"].data(cpu(0)).to_vector(), rm1 = params["1.running_mean"].data(cpu(1)).to_vector();
    if (sync) CHECK(rm0 == rm1);
    else CHECK(rm0 != rm1);
  }
}

TEST_CASE("save -> load -> evaluate gives the same accuracy; resume after epoch 1 == 2 epochs, bit for bit") {
  const std::string params = temp_path("params.safetensors"), ckpt = temp_path("ckpt.safetensors");
  SUBCASE("save and evaluate") {
    Config c = resnet_tiny(2);
    c.save_params = params;
    Result r = concise::train(c);
    concise::SavedResult saved = concise::evaluate_saved(c, params);
    CHECK(saved.accuracy == r.test_acc.back());  // device 0's replica, as trained
    CHECK(saved.images == c.test_data->n);
    Config lab = lab_small(1);
    lab.save_params = params;
    Result rl = concise::train(lab);
    CHECK(concise::evaluate_saved(lab, params).accuracy == rl.test_acc.back());
  }
  SUBCASE("resume") {
    Config c = resnet_tiny(2, 24);  // 3 steps per epoch; BatchNorm statistics differ per device
    c.num_epochs = 2;
    Result whole = concise::train(c);
    Config first = c;
    first.num_epochs = 1;
    first.checkpoint = ckpt;
    concise::train(first);
    Config rest = c;
    rest.resume = ckpt;
    Result resumed = concise::train(rest);
    CHECK(resumed.first_epoch == 2);
    REQUIRE(resumed.test_acc.size() == 1);
    CHECK(resumed.test_acc[0] == whole.test_acc[1]);
    CHECK(resumed.train_loss[0] == whole.train_loss[1]);
    for (Device d : c.devices) CHECK(values(resumed, d) == values(whole, d));
  }
  std::filesystem::remove(params);
  std::filesystem::remove(ckpt);
}

TEST_CASE("the lab's CNN on two emulated GPUs trains as on two CPU devices: the same losses") {
  // Emulation is ~100x slower: 40 images of 16x16 (conv 14x14 -> pool 7 -> conv 3x3 -> pool 1), batch
  // 20, 3 epochs. Left out of the TSan run (meson.build).
  auto config = [](std::vector<Device> devices) {
    Config c = lab_small(2);
    c.devices = devices;
    use_devices(devices);
    test::generated_images(c, 40, 20, 16, 31);
    c.batch_size = 20;
    c.num_epochs = 3;
    return c;
  };
  Result on_cpu = concise::train(config({cpu(0), cpu(1)}));
  Result on_emu = concise::train(config({emu(0), emu(1)}));
  REQUIRE(on_emu.train_loss.size() == 3);
  for (size_t e = 0; e < 3; ++e) {
    CAPTURE(e);
    CHECK(std::fabs(on_emu.train_loss[e] - on_cpu.train_loss[e]) <= 1e-4 * on_cpu.train_loss[e]);
  }
  MESSAGE("loss per epoch on cpu " << on_cpu.train_loss[0] << " .. " << on_cpu.train_loss[2] << ", on emu "
                                   << on_emu.train_loss[0] << " .. " << on_emu.train_loss[2]);
  CHECK(on_cpu.train_loss[2] < on_cpu.train_loss[0]);
  CHECK(values(on_emu, emu(1)) == values(on_emu, emu(0)));
  CHECK(max_rel_diff(values(on_cpu, cpu(0)), values(on_emu, emu(0))) < 1e-4);
}

TEST_CASE("exercise 2: --balance gives a slow device (an emulated GPU) a small share") {
  Config c = lab_small(1);
  c.devices = {cpu(0), emu(0)};
  use_devices(c.devices);
  test::generated_images(c, 40, 20, 16, 31);
  c.batch_size = 40;
  c.balance = true;
  Result r = concise::train(c);
  REQUIRE(r.split_weights.size() == 2);
  MESSAGE("weights cpu(0) " << r.split_weights[0] << ", emu(0) " << r.split_weights[1]);
  // The emulation runs kernels 30-100x slower: measured 0.80-0.95 on an idle machine, 0.68 with both
  // cores busy (the probe's steps are milliseconds, so the load shows). Without balancing the split
  // is even (0.5): the check fails then.
  CHECK(r.split_weights[0] > 0.55);
  CHECK(r.split_weights[0] + r.split_weights[1] == doctest::Approx(1.0));
}

TEST_CASE("the cells: replicas equal on both devices, gradients differ, 'not initialized on cpu(0)'") {
  std::ostringstream out;
  auto* old = std::cout.rdbuf(out.rdbuf());
  std::vector<Device> devices{cpu(1), cpu(2)};  // cpu(0) holds no replica, as the host in the book
  use_devices(devices);
  concise::demo(devices);
  Config data = lab_small(1);
  concise::lab({cpu(0), cpu(1)}, data);
  std::cout.rdbuf(old);
  const std::string s = out.str();
  CHECK(s.find("not initialized on cpu(0)") != std::string::npos);
  CHECK(s.find("<Tensor 2x10 @cpu(1)>") != std::string::npos);
  CHECK(s.find("<Tensor 2x10 @cpu(2)>") != std::string::npos);
  // The printed weight rows are the same on both devices, the gradient rows are not.
  auto block = [&](const std::string& header) {
    size_t at = s.find(header);
    REQUIRE(at != std::string::npos);
    size_t begin = s.find('\n', at) + 1, end = s.find("<Tensor", begin);
    return s.substr(begin, end - begin);
  };
  CHECK(block("channel 0 of the first conv on cpu(0)") == block("channel 0 of the first conv on cpu(1)"));
  CHECK(block("grad of channel 0 of the first conv2d on cpu(0)") != block("grad of channel 0 of the first conv2d on cpu(1)"));
}

TEST_CASE("bad input: each setting's bad values, bad checkpoints, parameters of another net") {
  auto bad = [](auto change, const char* what) {
    Config c = lab_small(2);
    change(c);
    CHECK_THROWS_WITH_AS(concise::train(c), doctest::Contains(what), ConfigError);
  };
  bad([](Config& c) { c.batch_size = 1; }, "--batch-size 1");
  bad([](Config& c) { c.batch_size = 0; }, "--batch-size 0");
  bad([](Config& c) { c.lr = -1; }, "--lr");
  bad([](Config& c) { c.lr = NAN; }, "--lr");
  bad([](Config& c) { c.num_epochs = 0; }, "--num-epochs");
  bad([](Config& c) { c.model = "vgg"; }, "--model 'vgg'");
  bad([](Config& c) { c.sync_bn = true; }, "--sync-bn");
  bad([](Config& c) { c.kvstore = "nccl"; }, "--kvstore 'nccl'");
  bad([](Config& c) { c.split_weights = {1}; }, "--split-weights");
  bad([](Config& c) { c.split_weights = {1, -2}; }, "--split-weights");
  bad([](Config& c) { c.split_weights = {1, 1}, c.balance = true; }, "not both");
  bad([](Config& c) { c.threads = {0}; }, "--threads 0");
  bad([](Config& c) { c.threads = {1, 1, 1}; }, "--threads");
  bad([](Config& c) { c.train_subset = 1000; }, "--train-subset 1000");
  bad([](Config& c) { c.test_subset = -1; }, "--test-subset");
  bad([](Config& c) { c.save_params = "/nonexistent/dir/p.safetensors"; }, "--save-params");
  bad([](Config& c) { c.checkpoint = "/nonexistent/dir/c.safetensors"; }, "--checkpoint");
  bad([](Config& c) { c.resume = "/nonexistent/c.safetensors"; }, "--resume");

  const std::string garbage = temp_path("garbage.safetensors"), lab_ckpt = temp_path("lab.safetensors");
  std::ofstream(garbage) << "not a safetensors file";
  bad([&](Config& c) { c.resume = garbage; }, "bad --resume checkpoint");
  Config lab = lab_small(1);
  lab.checkpoint = lab_ckpt;
  concise::train(lab);
  bad([&](Config& c) { c.resume = lab_ckpt, c.model = "resnet18"; }, "bad --resume checkpoint");
  {  // a checkpoint cut short
    std::ifstream in(lab_ckpt, std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), {});
    std::ofstream(garbage, std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  bad([&](Config& c) { c.resume = garbage; }, "bad --resume checkpoint");

  // --load-params: a net of another model, and one of the same layout with another shape.
  Config other = resnet_tiny(1);
  CHECK_THROWS_WITH_AS(concise::evaluate_saved(other, lab_ckpt), doctest::Contains("bad --load-params"), ConfigError);
  auto five = concise::lab_cnn();
  auto five_classes = std::make_shared<nn::Sequential>();  // the lab's layout, 5 classes
  for (int i = 0; i < 6; ++i) five_classes->add(five->at(i));
  five_classes->add(std::make_shared<nn::Dense>(5));
  five_classes->initialize(Init::Uniform(), {cpu(0)});
  {
    NoGrad no_grad;
    (*five_classes)(Tensor::zeros({1, 1, 28, 28}, cpu(0)));  // completes the deferred shapes
  }
  io::save_parameters(*five_classes, garbage);
  CHECK_THROWS_WITH_AS(concise::evaluate_saved(lab_small(1), garbage), doctest::Contains("6.weight"), ConfigError);
  CHECK_THROWS_AS(concise::evaluate_saved(lab_small(1), "/nonexistent/p.safetensors"), ConfigError);
  std::filesystem::remove(garbage);
  std::filesystem::remove(lab_ckpt);
}
