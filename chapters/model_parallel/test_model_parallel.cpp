// Chapter 3 (model parallelism): ResNet-50 has torchvision's layout (names, shapes, files, and the
// numbers of torchvision itself when PyTorch is installed); the model-parallel and pipelined models
// compute exactly what one device computes; the experiment writes its plots and timeline; bad input
// is one clear error.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "chapters/model_parallel/experiment.hpp"
#include "chapters/model_parallel/report.hpp"
#include "core/checkpoint/parameters_file.hpp"
#include "core/autograd.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "tests/check.hpp"

using namespace d2l;
namespace fs = std::filesystem;

namespace {
std::vector<Device> devices(DeviceKind kind, int n) {
  std::vector<Device> d;
  for (int i = 0; i < n; ++i) d.push_back(Device{kind, i});
  use_devices(d);
  return d;
}

std::string make_tmpdir() {
  auto dir = fs::temp_directory_path() / ("d2l_mp_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  return dir.string();
}

// |a - b| / |a| (2-norms, in double): how far two tensors' values are apart.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double diff = 0, norm = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    diff += (double(a[i]) - b[i]) * (double(a[i]) - b[i]);
    norm += double(a[i]) * a[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

// The worst rel_diff over every parameter's value and (for trainable ones) gradient, matched by name.
double worst_param_diff(const nn::Block& ref, const nn::Block& got, bool grads) {
  auto a = ref.collect_params(), b = got.collect_params();
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (auto& [name, p] : a) {
    Parameter& q = b[name];
    CAPTURE(name);
    Tensor x = grads ? (p->differentiable() ? p->grad(p->list_ctx()[0]) : Tensor()) : p->data(p->list_ctx()[0]);
    Tensor y = grads ? (q.differentiable() ? q.grad(q.list_ctx()[0]) : Tensor()) : q.data(q.list_ctx()[0]);
    if (!x.defined()) continue;
    double d = rel_diff(x.to_vector(), y.to_vector());
    if (!(d <= 1e-4)) MESSAGE(name << (grads ? " grad" : "") << " rel diff " << d);
    worst = std::max(worst, d);
  }
  return worst;
}

// One-hot targets (N, C): row i has its 1 in column (7 i + 3) mod C.
Tensor one_hot(int64_t N, int64_t C, Device d) {
  std::vector<float> t(static_cast<size_t>(N * C), 0.0f);
  for (int64_t i = 0; i < N; ++i) t[static_cast<size_t>(i * C + (7 * i + 3) % C)] = 1.0f;
  return Tensor::from_vector(t, {N, C}, d);
}

// torchvision's resnet50 state_dict keys and shapes, written out from torchvision/models/resnet.py
// (not from this project's blocks); num_batches_tracked entries are I64 scalars (shape ()).
std::vector<std::pair<std::string, Shape>> torchvision_resnet50_keys(int64_t num_classes) {
  std::vector<std::pair<std::string, Shape>> keys;
  auto bn = [&](const std::string& p, int64_t c) {
    for (const char* n : {"weight", "bias", "running_mean", "running_var"}) keys.push_back({p + "." + n, {c}});
    keys.push_back({p + ".num_batches_tracked", {}});
  };
  keys.push_back({"conv1.weight", {64, 3, 7, 7}});
  bn("bn1", 64);
  int64_t inplanes = 64;
  const int blocks[4] = {3, 4, 6, 3};
  for (int l = 0; l < 4; ++l) {
    int64_t planes = 64 << l;
    for (int b = 0; b < blocks[l]; ++b) {
      std::string p = "layer" + std::to_string(l + 1) + "." + std::to_string(b);
      keys.push_back({p + ".conv1.weight", {planes, inplanes, 1, 1}});
      bn(p + ".bn1", planes);
      keys.push_back({p + ".conv2.weight", {planes, planes, 3, 3}});
      bn(p + ".bn2", planes);
      keys.push_back({p + ".conv3.weight", {planes * 4, planes, 1, 1}});
      bn(p + ".bn3", planes * 4);
      if (b == 0) {
        keys.push_back({p + ".downsample.0.weight", {planes * 4, inplanes, 1, 1}});
        bn(p + ".downsample.1", planes * 4);
      }
      inplanes = planes * 4;
    }
  }
  keys.push_back({"fc.weight", {num_classes, 2048}});
  keys.push_back({"fc.bias", {num_classes}});
  return keys;
}
}  // namespace

TEST_CASE("ToyModel: net1 on dev0, net2 on dev1, one SGD step lowers the loss") {
  auto d = devices(DeviceKind::cpu, 2);
  manual_seed(0);
  mp::ToyModel model(d[0], d[1]);
  CHECK(model.net1->weight->list_ctx() == std::vector<Device>{d[0]});
  CHECK(model.net2->bias->list_ctx() == std::vector<Device>{d[1]});
  Tensor y = model(Tensor::ones({20, 10}, d[0]));
  CHECK(y.device() == d[1]);
  CHECK(y.shape() == Shape{20, 5});
  auto [before, after] = mp::toy_step(d[0], d[1], false);
  CHECK(after < before);
  // MSELoss is PyTorch's: the mean of the squares, twice d2l's squared loss.
  Tensor p = Tensor::from_vector(std::vector<float>{1, 2, 3, 4}, {2, 2}, d[0]);
  CHECK(mp::mse(p, Tensor::zeros({2, 2}, d[0])).item() == doctest::Approx(30.0 / 4));
}

TEST_CASE("resnet50: torchvision's parameter names, order, shapes and count; convs without bias") {
  manual_seed(0);
  auto net = mp::resnet50(1000);
  auto params = net->collect_params();
  std::vector<std::pair<std::string, Shape>> expected;
  for (auto& k : torchvision_resnet50_keys(1000))
    if (k.first.find("num_batches_tracked") == std::string::npos) expected.push_back(k);
  REQUIRE(params.size() == expected.size());  // 267: 161 trainable, 53 BatchNorms x 2 statistics
  int64_t trainable = 0;
  for (size_t i = 0; i < expected.size(); ++i) {
    CAPTURE(expected[i].first);
    CHECK(params.items()[i].first == expected[i].first);
    CHECK(params.items()[i].second->shape() == expected[i].second);
    if (params.items()[i].second->differentiable()) trainable += numel(expected[i].second);
  }
  CHECK(trainable == 25557032);  // torchvision: sum(p.numel() for p in resnet50().parameters())
  CHECK(params.trainable().size() == 161);
  CHECK_FALSE(params.contains("conv1.bias"));
  // torchvision's initialisation: kaiming normal (fan out) for conv1, U(+-1/sqrt(2048)) for fc.
  auto w = params["conv1.weight"].data(cpu(0)).to_vector();
  double sq = 0;
  for (float v : w) sq += double(v) * v;
  CHECK(std::sqrt(sq / w.size()) == doctest::Approx(std::sqrt(2.0 / (64 * 49))).epsilon(0.05));
  for (float v : params["fc.bias"].data(cpu(0)).to_vector()) CHECK(std::fabs(v) <= 1 / std::sqrt(2048.0f));
  CHECK(net->layer_names().size() == 22);
  CHECK(net->layer_list()->size() == 22);
}

TEST_CASE("a torchvision-layout state_dict loads into resnet50; a wrong name or shape is a clear error") {
  std::string dir = make_tmpdir();
  io::SafetensorsFile file;
  int64_t k = 0;
  for (auto& [name, shape] : torchvision_resnet50_keys(10)) {
    if (shape.empty()) {
      file.tensors[name] = io::FileTensor::from_ints(io::FileDtype::i64, {}, {7});
      continue;
    }
    std::vector<float> v(static_cast<size_t>(numel(shape)));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>((k + 3 * i) % 101) / 64.0f;  // exact in float
    file.tensors[name] = io::FileTensor::from_floats(shape, v);
    ++k;
  }
  io::save_safetensors(dir + "/resnet50.safetensors", file);
  manual_seed(0);
  auto net = mp::resnet50(10);
  io::load_parameters(*net, dir + "/resnet50.safetensors", {cpu(0)});
  for (auto& [name, p] : net->collect_params()) {
    CAPTURE(name);
    CHECK(p->data(cpu(0)).to_vector() == file.tensors.at(name).floats());
  }

  auto bad = file;
  bad.tensors["layer2.1.bn2.gamma"] = bad.tensors.at("layer2.1.bn2.weight");
  bad.tensors.erase("layer2.1.bn2.weight");
  io::save_safetensors(dir + "/bad_name.safetensors", bad);
  CHECK_THROWS_WITH_AS(io::load_parameters(*net, dir + "/bad_name.safetensors"), doctest::Contains("layer2.1.bn2.weight"),
                       ParameterError);
  bad = file;
  bad.tensors["fc.weight"] = io::FileTensor::from_floats({10, 1024}, std::vector<float>(10240, 0.0f));
  io::save_safetensors(dir + "/bad_shape.safetensors", bad);
  CHECK_THROWS_WITH_AS(io::load_parameters(*net, dir + "/bad_shape.safetensors"), doctest::Contains("fc.weight"),
                       ParameterError);
  // Nothing changed by the failed loads.
  CHECK(net->collect_params()["fc.weight"].data(cpu(0)).to_vector() == file.tensors.at("fc.weight").floats());
  fs::remove_all(dir);
}

// Skipped (reported as such) when the Python of d2l::test::python() cannot import torch and torchvision.
TEST_CASE("torchvision's own ResNet-50: its state_dict loads, and ours computes its outputs and gradients" *
          doctest::skip(!d2l::test::python_can_import("torch, torchvision"))) {
  // chapters/model_parallel/torchvision_resnet50.py, beside this file.
  std::string python = d2l::test::python(), script = d2l::test::beside_source(__FILE__, "torchvision_resnet50.py");
  REQUIRE_MESSAGE(fs::exists(script), "no " << script);
  std::string dir = make_tmpdir();
  std::fflush(nullptr);
  int rc = std::system(("'" + python + "' '" + script + "' '" + dir + "'").c_str());
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  auto ref = io::load_safetensors(dir + "/reference.safetensors");
  auto values = [&](const std::string& name) { return ref.tensors.at(name).floats(); };
  manual_seed(1);  // other initial values: the file must replace them all
  auto net = mp::resnet50(10);
  io::load_parameters(*net, dir + "/resnet50.safetensors", {cpu(0)});
  Tensor x = Tensor::from_vector(values("x"), {4, 3, 64, 64}, cpu(0));
  Tensor y = (*net)(x);
  Tensor loss = mp::mse(y, Tensor::from_vector(values("target"), {4, 10}, cpu(0)));
  loss.backward();
  // Training mode at batch 4: BatchNorm over few values per channel (16 in layer4) makes the
  // gradients sensitive to rounding (PyTorch's float32 gradients differ from its float64 ones by
  // about 4%), and the running statistics after the step too (up to 7e-5), so ours are measured
  // against the float64 ones, beside PyTorch's float32 ones.
  double dy = rel_diff(values("y"), y.to_vector());
  std::vector<double> ours, torch32, ours_stat, torch32_stat;  // per tensor: rel diff to float64
  for (auto& [name, p] : net->collect_params()) {
    if (p->differentiable()) {
      ours.push_back(rel_diff(values("grad64/" + name), p->grad(cpu(0)).to_vector()));
      torch32.push_back(rel_diff(values("grad64/" + name), values("grad/" + name)));
    } else {
      ours_stat.push_back(rel_diff(values("after64/" + name), p->data(cpu(0)).to_vector()));
      torch32_stat.push_back(rel_diff(values("after64/" + name), values("after/" + name)));
    }
  }
  for (auto* v : {&ours, &torch32, &ours_stat, &torch32_stat}) std::sort(v->begin(), v->end());
  REQUIRE(ours_stat.size() == 2 * 53);  // running_mean and running_var of ResNet-50's 53 BatchNorms
  Tensor y_eval;
  {
    TrainMode eval(false);
    NoGrad no_grad;
    y_eval = (*net)(x);
  }
  double de = rel_diff(values("y_eval"), y_eval.to_vector());
  auto median = [](const std::vector<double>& v) { return v[v.size() / 2]; };
  MESSAGE("ours vs torchvision: output " << dy << ", loss " << loss.item() << " vs " << values("loss")[0]
          << ", evaluation output " << de << "; vs float64, median / max: gradients ours " << median(ours)
          << " / " << ours.back() << ", PyTorch float32 " << median(torch32) << " / " << torch32.back()
          << "; running statistics ours " << median(ours_stat) << " / " << ours_stat.back()
          << ", PyTorch float32 " << median(torch32_stat) << " / " << torch32_stat.back());
  CHECK(dy <= 1e-3);
  CHECK(loss.item() == doctest::Approx(values("loss")[0]).epsilon(1e-4));
  CHECK(median(ours) <= 2 * median(torch32));
  CHECK(ours.back() <= 2 * torch32.back());
  CHECK(median(ours_stat) <= 2 * median(torch32_stat));
  CHECK(ours_stat.back() <= 2 * torch32_stat.back());
  CHECK(de <= 1e-4);
  fs::remove_all(dir);
}

TEST_CASE("ModelParallelResNet50 on 2 devices: outputs, loss, gradients and statistics of one device") {
  auto d = devices(DeviceKind::cpu, 2);
  const int64_t N = 8, C = 10;
  Tensor x = Tensor::from_vector(test::lcg_data(N * 3 * 32 * 32, 5), {N, 3, 32, 32}, d[0]);
  manual_seed(3);
  auto single = mp::resnet50(C);
  manual_seed(3);
  mp::ModelParallelResNet50 model(d[0], d[1], C);
  CHECK(model.conv1->weight->list_ctx() == std::vector<Device>{d[0]});
  CHECK(model.layer2->children()[3].second->collect_params()["conv3.weight"].list_ctx() == std::vector<Device>{d[0]});
  CHECK(model.layer3->collect_params()["0.conv1.weight"].list_ctx() == std::vector<Device>{d[1]});
  CHECK(model.fc->weight->list_ctx() == std::vector<Device>{d[1]});

  Tensor ref = (*single)(x);
  Tensor out = model(x);
  CHECK(out.device() == d[1]);
  CHECK(rel_diff(ref.to_vector(), out.to_vector()) <= 1e-4);
  mp::mse(ref, one_hot(N, C, d[0])).backward();
  mp::mse(out, one_hot(N, C, d[1])).backward();
  CHECK(worst_param_diff(*single, model, true) <= 1e-4);
  CHECK(worst_param_diff(*single, model, false) <= 1e-4);  // running statistics too
}

namespace {
// The reference for a pipelined model: the single-device model run on each micro-batch in turn, as
// the section's loop does, with the whole batch's MSELoss split into the micro-batches' shares.
struct Reference {
  Tensor output, loss;
};
Reference per_micro_batch(mp::ResNet& net, const Tensor& x, const Tensor& target, int64_t split, bool backward,
                          const optim::GradScaler& scaler = optim::GradScaler({.enabled = false})) {
  std::vector<Tensor> outs;
  Tensor total;
  for (auto [b, e] : pipeline::micro_batches(x.dim(0), split)) {
    Tensor out = net(slice_rows(x, b, e));
    outs.push_back(out);
    if (!backward) continue;
    Tensor l = mse_loss(out, slice_rows(target, b, e), Reduction::sum) * (2.0f / static_cast<float>(target.numel()));
    scaler.scale(l).backward();
    total = total.defined() ? total.detach() + l.detach() : l.detach();
  }
  return {concat(outs), total};
}

void check_pipeline(const std::vector<Device>& d, pipeline::Schedule schedule, int64_t split, int64_t N, int64_t S,
                    pipeline::Checkpoint checkpoint = pipeline::Checkpoint::never,
                    const optim::GradScaler& scaler = optim::GradScaler({.enabled = false})) {
  const int64_t C = 10;
  CAPTURE(str(d));
  CAPTURE(pipeline::name(schedule));
  CAPTURE(pipeline::name(checkpoint));
  CAPTURE(split);
  Tensor x = Tensor::from_vector(test::lcg_data(N * 3 * S * S, 9), {N, 3, S, S}, d[0]);
  manual_seed(4);
  auto single = mp::resnet50(C);
  single->to(d[0]);
  manual_seed(4);
  mp::PipelineParallelResNet50 model(split, d, schedule, {}, C);
  model.checkpoint = checkpoint;
  REQUIRE(model.stages.size() == d.size());
  // The forward pass alone, then forward and backward by the schedule.
  Reference fwd = per_micro_batch(*single, x, Tensor(), split, false);
  Tensor out = model(x);
  CHECK(out.device() == d.back());
  CHECK(rel_diff(fwd.output.to_vector(), out.to_vector()) <= 1e-4);
  Reference ref = per_micro_batch(*single, x, one_hot(N, C, d[0]), split, true, scaler);
  Tensor loss = model.forward_backward(x, one_hot(N, C, d.back()), scaler);
  CHECK(loss.item() == doctest::Approx(ref.loss.item()).epsilon(1e-5));
  CHECK(worst_param_diff(*single, model, true) <= 1e-4);
  CHECK(worst_param_diff(*single, model, false) <= 1e-4);
}
}  // namespace

// Each check costs a ResNet-50 step on 6 (or 4) images. 33x33: the smallest input whose layer4 maps
// are 2x2, so BatchNorm has two values per channel even in a micro-batch of one image (at 32x32 that
// is an error, in PyTorch too). Split size 2 of 6 images: 3 micro-batches, as many as K = 3 stages.
TEST_CASE("PipelineParallelResNet50: gpipe, 1f1b and zb-h1 (K = 2 and 3, split size 2) compute one device's numbers") {
  auto d = devices(DeviceKind::cpu, 3);
  for (auto schedule : {pipeline::Schedule::gpipe, pipeline::Schedule::one_f_one_b, pipeline::Schedule::zb_h1}) {
    check_pipeline({d[0], d[1]}, schedule, 2, 6, 33);
    if (schedule != pipeline::Schedule::zb_h1) check_pipeline(d, schedule, 2, 6, 33);
  }
  check_pipeline(d, pipeline::Schedule::zb_h1, 1, 6, 33);
}

// The other split sizes (a micro-batch of one image; one micro-batch, no pipelining) on 4 images: in
// the plain build only (meson test model_parallel_split_sizes), minutes under the sanitizers.
TEST_CASE("PipelineParallelResNet50: gpipe and 1f1b at split sizes 1 and 4 (K = 2 and 3) compute one device's numbers") {
  auto d = devices(DeviceKind::cpu, 3);
  for (auto schedule : {pipeline::Schedule::gpipe, pipeline::Schedule::one_f_one_b})
    for (int64_t split : {1, 4}) {
      check_pipeline({d[0], d[1]}, schedule, split, 4, 33);
      check_pipeline(d, schedule, split, 4, 33);
    }
}

TEST_CASE("--precision bf16 and fp16: under autocast gpipe and 1f1b compute one device's numbers, fp16's loss scaled") {
  // The same micro-batches through the same ops in 16 bits: the schedules change where and when each
  // runs, not what it computes. fp16 backward from each share times 2^8 (a scale that does not
  // overflow here), on both sides; the loss comes back unscaled.
  auto d = devices(DeviceKind::cpu, 2);
  const optim::GradScaler scaled({.init_scale = 256.0f});
  {
    Autocast mixed(DType::bf16);
    check_pipeline(d, pipeline::Schedule::gpipe, 2, 6, 33);
  }
  Autocast mixed(DType::f16);
  check_pipeline(d, pipeline::Schedule::one_f_one_b, 2, 6, 33, pipeline::Checkpoint::never, scaled);
}

TEST_CASE("recomputation (--checkpoint always, except_last) computes the same numbers, running statistics included") {
  auto d = devices(DeviceKind::cpu, 3);
  using pipeline::Checkpoint;
  using pipeline::Schedule;
  check_pipeline({d[0], d[1]}, Schedule::gpipe, 2, 6, 33, Checkpoint::always);
  check_pipeline(d, Schedule::zb_h1, 2, 6, 33, Checkpoint::always);
  check_pipeline(d, Schedule::one_f_one_b, 2, 6, 33, Checkpoint::except_last);
}

TEST_CASE("memory: GPipe's peak grows with the micro-batches, 1f1b's does not, recomputation keeps less") {
  auto d = devices(DeviceKind::cpu, 2);
  use_devices(d);
  mp::Config cfg;
  cfg.image_size = 48, cfg.num_classes = 10, cfg.verbose = false, cfg.out_dir = "";
  manual_seed(3);
  mp::PipelineParallelResNet50 model(2, d, pipeline::Schedule::gpipe, {}, 10);
  using pipeline::Checkpoint;
  using pipeline::Schedule;
  auto pts = mp::memory_vs_microbatches(model, cfg, 2, {1, 2, 8},
                                        {{Schedule::gpipe, Checkpoint::never}, {Schedule::one_f_one_b, Checkpoint::never},
                                         {Schedule::one_f_one_b, Checkpoint::always}});
  REQUIRE(pts.size() == 9);
  auto at = [&](Schedule s, Checkpoint c, size_t M) {
    for (auto& p : pts)
      if (p.schedule == s && p.checkpoint == c && p.M == M) return p.peak;
    FAIL("no point");
    return std::vector<int64_t>{};
  };
  const size_t K = 2, M = 8;
  double saved_all = 0, predicted_all = 0;
  for (size_t s = 0; s < K; ++s) {
    CAPTURE(s);
    // One micro-batch's activations on stage s: what GPipe adds from M = 1 to 2.
    const double a = double(at(Schedule::gpipe, Checkpoint::never, 2)[s] - at(Schedule::gpipe, Checkpoint::never, 1)[s]);
    CHECK(a > 0);
    // GPipe holds M micro-batches, 1f1b min(M, K-s): the saving the formula predicts.
    const double predicted = double(M - std::min(M, K - s)) * a;
    const double saved = double(at(Schedule::gpipe, Checkpoint::never, M)[s] - at(Schedule::one_f_one_b, Checkpoint::never, M)[s]);
    MESSAGE("stage " << s << ": one micro-batch " << a / 1e6 << " MB; 1f1b saves " << saved / 1e6 << " MB of the "
                     << predicted / 1e6 << " MB predicted");
    CHECK(saved > 0);
    saved_all += saved, predicted_all += predicted;
  }
  // Over the step (both devices): at least half the predicted saving. (Per device, a kernel's
  // scratch, taken when the kernel runs, may meet the host's peak or not: a few MB either way on the
  // small stage 1, e.g. under the sanitizers' slower devices.)
  CHECK(saved_all >= 0.5 * predicted_all);
  // Stage 0 holds K micro-batches under 1f1b; recomputed, only their inputs.
  CHECK(at(Schedule::one_f_one_b, Checkpoint::always, M)[0] < at(Schedule::one_f_one_b, Checkpoint::never, M)[0]);
}

TEST_CASE("PipelineParallelResNet50: partitions (default, given, balanced) and their errors") {
  auto d = devices(DeviceKind::cpu, 3);
  CHECK(mp::default_partition(2) == std::vector<size_t>{0, 11});
  CHECK(mp::default_partition(3) == std::vector<size_t>{0, 8, 15});
  manual_seed(0);
  mp::PipelineParallelResNet50 model(4, {d[0], d[1]}, pipeline::Schedule::gpipe, {}, 10);
  CHECK(model.partition_str() == "conv1..layer2.3 on cpu(0) | layer3.0..fc on cpu(1)");
  // The section's cut: seq1 (conv1 .. layer2) on dev0, seq2 and fc on dev1.
  CHECK(model.layer2->collect_params()["3.bn3.weight"].list_ctx() == std::vector<Device>{d[0]});
  CHECK(model.layer3->collect_params()["0.bn1.weight"].list_ctx() == std::vector<Device>{d[1]});
  model.set_partition({0, 20});
  CHECK(model.layer4->collect_params()["2.conv3.weight"].list_ctx() == std::vector<Device>{d[0]});
  CHECK(model.fc->weight->list_ctx() == std::vector<Device>{d[1]});
  CHECK_THROWS_WITH_AS(model.set_partition({0, 22}), doctest::Contains("--partition '0,22'"), ConfigError);
  CHECK_THROWS_WITH_AS(model.set_partition({1, 5}), doctest::Contains("--partition"), ConfigError);
  CHECK_THROWS_WITH_AS(model.set_partition({0, 5, 9}), doctest::Contains("--partition"), ConfigError);
  // --balance: measured costs, and a cut no worse than the default one by those costs.
  Tensor sample = Tensor::from_vector(test::lcg_data(2 * 3 * 32 * 32, 1), {2, 3, 32, 32}, d[0]);
  std::vector<double> costs;
  auto starts = mp::balanced_partition(model, sample, d[0], 2, &costs);
  REQUIRE(costs.size() == 22);
  CHECK(pipeline::largest_stage_cost(costs, starts) <= pipeline::largest_stage_cost(costs, {0, 11}));
  model.set_partition(starts);
  CHECK(model.stages[1].device == d[1]);
  CHECK_THROWS_AS(mp::PipelineParallelResNet50(0, {d[0], d[1]}), ConfigError);
  CHECK_THROWS_AS(mp::PipelineParallelResNet50(2, {d[0]}), ConfigError);
}

// forward() on 2 devices is the section's s_next / s_prev loop (pipeline_resnet50.cpp); on 3, core/
// pipeline's. Both must give the numbers of the K-stage forward, micro-batch by micro-batch (training
// mode: BatchNorm normalises each micro-batch, as the section's model does).
TEST_CASE("PipelineParallelResNet50::forward, the section's s_next / s_prev loop, is core/pipeline's forward") {
  auto d = devices(DeviceKind::cpu, 3);
  const int64_t N = 4, C = 10;  // 32x32 images: layer4 is 1x1, so micro-batches of 2 or more
  Tensor x = Tensor::from_vector(test::lcg_data(N * 3 * 32 * 32, 3), {N, 3, 32, 32}, cpu(0));
  for (int64_t split : {2, 4}) {
    CAPTURE(split);
    manual_seed(4);
    mp::PipelineParallelResNet50 model(split, {d[0], d[1]}, pipeline::Schedule::gpipe, {}, C);
    Tensor y = model.forward(x);
    CHECK(y.device() == d[1]);
    REQUIRE(y.shape() == Shape{N, C});
    Tensor want = pipeline::forward(model.stages, x, split);
    CHECK(test::close(want.to_vector(), y.to_vector(), 1e-6, 1e-6, "forward vs pipeline::forward"));
    // and not merely the whole-batch forward: two micro-batches of 2 differ from one batch of 4
    if (split == 2) {
      Tensor whole = pipeline::forward(model.stages, x, N);
      CHECK_FALSE(test::close(whole.to_vector(), y.to_vector(), 1e-4, 1e-4));
    }
  }
  CHECK_THROWS_AS(mp::PipelineParallelResNet50(5, {d[0], d[1]}, pipeline::Schedule::gpipe, {}, C).forward(x), ConfigError);
}

namespace {
// A narrow network of the same pieces as ResNet-50 (stem conv, BatchNorm, Bottlenecks with and
// without stride and downsample, global pool, fc): small enough for the emulated GPUs.
std::shared_ptr<nn::Sequential> small_bottleneck_net() {
  auto ds = [](int64_t in, int64_t out, int64_t stride) {
    auto s = std::make_shared<nn::Sequential>();
    s->add(std::make_shared<nn::Conv2D>(out, 1, stride, 0, false, in), std::make_shared<nn::BatchNorm>(out));
    return s;
  };
  auto net = std::make_shared<nn::Sequential>();
  net->add(std::make_shared<nn::Conv2D>(8, 3, 1, 1, false, 3), std::make_shared<nn::BatchNorm>(8),
           std::make_shared<nn::Activation>("relu"), std::make_shared<mp::Bottleneck>(8, 4, 1, ds(8, 16, 1)),
           std::make_shared<mp::Bottleneck>(16, 4), std::make_shared<mp::Bottleneck>(16, 4, 2, ds(16, 16, 2)),
           std::make_shared<nn::GlobalAvgPool2D>(), std::make_shared<nn::Dense>(10, "", true, 16));
  net->initialize(Init::Normal(0.3f), {cpu(0)});
  return net;
}
}  // namespace

// The emulation runs every CUDA kernel on fibers, ~100x slower than a CPU device: a whole ResNet-50
// forward and backward on it takes minutes. So: the pipelined ResNet-50's forward pass (evaluation
// mode) on emulated GPUs against CPU devices (different kernels: within 1e-4), and the pipeline's training step on
// emulated GPUs with a small network of Bottlenecks against that network on one emulated GPU.
TEST_CASE("on 2 emulated GPUs: the pipelined ResNet-50's forward, and a Bottleneck pipeline's gradients") {
  auto e = devices(DeviceKind::emu, 2);
  {
    const int64_t N = 2, C = 10;
    Tensor x = Tensor::from_vector(test::lcg_data(N * 3 * 33 * 33, 2), {N, 3, 33, 33}, cpu(0));
    manual_seed(6);
    auto single = mp::resnet50(C);  // on cpu(0)
    manual_seed(6);
    mp::PipelineParallelResNet50 model(1, e, pipeline::Schedule::gpipe, {}, C);
    // Evaluation mode: BatchNorm with its running statistics. In training mode a micro-batch of one
    // 33x33 image normalises layer4 over 4 values per channel, which magnifies the kernels' rounding
    // differences (emulated vs CPU) to ~6e-4.
    NoGrad no_grad;
    TrainMode eval(false);
    Reference ref = per_micro_batch(*single, x, Tensor(), 1, false);
    Tensor out = model(x);
    CHECK(out.device() == e[1]);
    CHECK(rel_diff(ref.output.to_vector(), out.to_vector()) <= 1e-4);
  }
  const int64_t N = 4, C = 10;
  Tensor x = Tensor::from_vector(test::lcg_data(N * 3 * 8 * 8, 3), {N, 3, 8, 8}, e[0]);
  for (auto schedule : {pipeline::Schedule::gpipe, pipeline::Schedule::one_f_one_b}) {
    CAPTURE(pipeline::name(schedule));
    manual_seed(8);
    auto single = small_bottleneck_net();
    single->to(e[0]);
    manual_seed(8);
    auto net = small_bottleneck_net();
    auto parts = pipeline::partition(*net, {0, 4});
    parts[0]->to(e[0]);
    parts[1]->to(e[1]);
    std::vector<pipeline::Stage> stages{{parts[0], e[0]}, {parts[1], e[1]}};
    const float scale = 2.0f / static_cast<float>(N * C);
    Tensor loss = pipeline::forward_backward(stages, x, one_hot(N, C, e[1]), 1, schedule,
        [scale](const Tensor& out, const Tensor& t) { return mse_loss(out, t, Reduction::sum) * scale; });
    Tensor target = one_hot(N, C, e[0]);
    double ref_loss = 0;
    for (int64_t i = 0; i < N; ++i) {
      Tensor l = mse_loss((*single)(slice_rows(x, i, i + 1)), slice_rows(target, i, i + 1), Reduction::sum) * scale;
      l.backward();
      ref_loss += l.item();
    }
    CHECK(loss.item() == doctest::Approx(ref_loss).epsilon(1e-5));
    CHECK(worst_param_diff(*single, *net, true) <= 1e-4);
    CHECK(worst_param_diff(*single, *net, false) <= 1e-4);
  }
  CHECK(runtime(e[1]).kernels_run() > 0);
}

namespace {
void check_quick_experiment(DeviceKind kind) {
  std::string dir = make_tmpdir();
  mp::Config cfg;
  cfg.memory_sweep = false;  // the sweep of peaks: model_parallel_memory (suite timing) and the program's quick run
  cfg.devices = devices(kind, 2);
  // Each timing repeated twice on CPU devices; once on the emulated GPUs, where a ResNet-50 step takes
  // seconds (the repeats' statistics are the CPU run's to check).
  cfg.batch_size = 4, cfg.image_size = 32, cfg.num_classes = 10, cfg.num_batches = 1;
  cfg.repeat = kind == DeviceKind::cpu ? 2 : 1;
  // The sweep's logic once, on CPU devices; the emulated GPUs time only its last point (no pipelining).
  cfg.split_size = 2, cfg.sweep = kind == DeviceKind::cpu ? std::vector<int64_t>{1, 2, 4, 8} : std::vector<int64_t>{4};
  cfg.out_dir = dir;
  cfg.trace_file = dir + "/step.json";
  cfg.verbose = false;
  auto r = mp::run(cfg);
  CHECK(r.mp.runs.size() == static_cast<size_t>(cfg.repeat));
  CHECK(r.rn.mean > 0);
  CHECK(r.pp.std >= 0);
  if (kind == DeviceKind::cpu) CHECK(r.sweep == std::vector<int64_t>{2, 4});  // 8 > the batch; 1 meets BatchNorm on 1x1 maps: skipped
  else CHECK(r.sweep == std::vector<int64_t>{4});
  // (The best split size against the printed table: model_parallel_quick, quick_run.sh.)
  REQUIRE(r.sweep_times.size() == r.sweep.size());
  CHECK(std::find(r.sweep.begin(), r.sweep.end(), r.best_split) != r.sweep.end());
  std::vector<std::string> pngs{"mp_vs_rn.png", "mp_vs_rn_vs_pp.png", "split_size_tradeoff.png"};
  CHECK(r.memory.empty());  // no sweep of peaks asked for, none run
  for (const std::string& png : pngs) {
    CAPTURE(png);
    std::ifstream f(dir + "/" + png, std::ios::binary);
    char magic[8] = {};
    f.read(magic, 8);
    CHECK(std::string(magic + 1, 3) == "PNG");
  }
  CHECK(r.plots.size() == pngs.size());
  auto json = nlohmann::json::parse(std::ifstream(cfg.trace_file));
  std::set<int64_t> pids;
  for (auto& ev : json.at("traceEvents"))
    if (ev.at("ph") == "X") pids.insert(ev.at("pid").get<int64_t>());
  CHECK(pids.size() == 2);  // both devices ran tasks
  // The same step by the other two schedules, beside it; zb-h1 fills some of 1f1b's idle time.
  REQUIRE(r.schedule_idle.size() == 3);
  for (auto sched : {pipeline::Schedule::one_f_one_b, pipeline::Schedule::zb_h1})
    CHECK(fs::exists(mp::schedule_trace_path(cfg.trace_file, sched)));
  // The bubble, measured here from the written trace: per device, the time its compute stream (tid 1)
  // ran no task within the step's window, as a fraction. The reported idle fractions must be these,
  // and with M = 2 micro-batches on K = 2 stages each device waits for the other some of the time.
  std::map<int64_t, std::vector<std::pair<double, double>>> busy;  // pid -> compute tasks [start, end)
  double t0 = 1e300, t1 = -1e300;
  for (auto& ev : json.at("traceEvents")) {
    if (ev.at("ph") != "X") continue;
    const double a = ev.at("ts").get<double>(), b = a + ev.at("dur").get<double>();
    t0 = std::min(t0, a), t1 = std::max(t1, b);
    if (ev.at("tid").get<int64_t>() == 1) busy[ev.at("pid").get<int64_t>()].push_back({a, b});
  }
  REQUIRE(r.idle.size() == 2);
  REQUIRE(busy.size() == 2);
  size_t d = 0;
  for (auto& [pid, tasks] : busy) {
    std::sort(tasks.begin(), tasks.end());
    double covered = 0, end = t0;
    for (auto [a, b] : tasks) {
      if (b > end) covered += b - std::max(a, end), end = b;
    }
    const double idle = 1 - covered / (t1 - t0);
    CAPTURE(pid);
    MESSAGE("device " << d << ": idle " << idle << " from the trace, reported " << r.idle[d]);
    CHECK(idle > 0);
    CHECK(r.idle[d] == doctest::Approx(idle).epsilon(0.01));
    ++d;
  }
  // Memory: the model-parallel model splits the parameters; one device holds them all.
  REQUIRE(r.mem_mp.size() == 2);
  CHECK(r.mem_mp[0].parameters + r.mem_mp[1].parameters == r.mem_rn[0].parameters);
  CHECK(r.mem_mp[0].parameters < r.mem_mp[1].parameters);  // layer3, layer4, fc hold most of them
  CHECK(r.mem_rn[0].peak > r.mem_rn[0].before);
  fs::remove_all(dir);
}
}  // namespace

TEST_CASE("the quick experiment on 2 CPU devices writes the three PNGs and a valid trace") {
  check_quick_experiment(DeviceKind::cpu);
}

// The hand-written CUDA kernels under the emulation: the same experiment end to end, each timing once.
TEST_CASE("the quick experiment on 2 emulated GPUs writes the three PNGs and a valid trace") {
  check_quick_experiment(DeviceKind::emu);
  CHECK(runtime(emu(1)).kernels_run() > 0);
}

TEST_CASE("bad input: split size, stages, partition, trace path, sizes") {
  mp::Config cfg;
  cfg.devices = devices(DeviceKind::cpu, 2);
  cfg.batch_size = 8;
  cfg.image_size = 32;
  cfg.split_size = 4;
  cfg.sweep = {1};
  CHECK_NOTHROW(mp::validate(cfg));
  auto with = [&](auto change) {
    mp::Config c = cfg;
    change(c);
    return c;
  };
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.split_size = 0; })), doctest::Contains("--split-size 0"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.split_size = -3; })), doctest::Contains("--split-size -3"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.split_size = 9; })), doctest::Contains("larger than --batch-size 8"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.split_size = 1; })), doctest::Contains("BatchNorm"), ConfigError);
  CHECK_NOTHROW(mp::validate(with([](mp::Config& c) { c.split_size = 1, c.image_size = 33; })));
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.stages = 3; })), doctest::Contains("--stages 3"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.devices = {cpu(0)}; })), doctest::Contains("at least 2 devices"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.partition = {0, 5, 9}; })), doctest::Contains("--partition"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.trace_file = "/nonexistent/dir/t.json"; })),
                       doctest::Contains("/nonexistent/dir"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.out_dir = "/nonexistent/plots"; })),
                       doctest::Contains("/nonexistent/plots"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.image_size = 16; })), doctest::Contains("--image-size 16"), ConfigError);
  CHECK_THROWS_WITH_AS(mp::validate(with([](mp::Config& c) { c.sweep = {4, 0}; })), doctest::Contains("--sweep"), ConfigError);
  CHECK_THROWS_WITH_AS(pipeline::parse_schedule("zigzag"), doctest::Contains("zigzag"), ConfigError);
}
