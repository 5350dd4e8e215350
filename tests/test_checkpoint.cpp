// Training checkpoints (core/checkpoint/checkpoint.hpp): a net with BatchNorm trained on two devices with
// the Trainer (momentum, weight decay) and random noise from the RNG, checkpointed after "epoch 1"
// and continued; a fresh net + trainer (shapes still deferred, another seed) loaded from the
// checkpoint and continued the same way ends with every parameter, every device's running
// statistics, the trainer state and the RNG state bitwise equal. Corrupt or mismatched
// checkpoints give one line naming the file and leave the net, the trainer and the RNG unchanged.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>

#include "core/checkpoint/checkpoint.hpp"
#include "core/checkpoint/parameters_file.hpp"
#include "core/nn/nn.hpp"
#include "core/nn/split_and_load.hpp"
#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "tests/check.hpp"

using namespace d2l;
using namespace d2l::io;
using namespace d2l::nn;
using optim::SGDOptions;
using optim::Trainer;
namespace fs = std::filesystem;

namespace {

const std::vector<Device> kDevices{cpu(0), cpu(1)};
constexpr int64_t kBatch = 8, kIn = 5, kStepsPerEpoch = 3;

// Dense(8, relu) -> BatchNorm -> Dense(3), input sizes inferred at the first forward.
std::shared_ptr<Sequential> make_net() {
  auto net = std::make_shared<Sequential>();
  net->add(std::make_shared<Dense>(8, "relu"), std::make_shared<BatchNorm>(), std::make_shared<Dense>(3));
  return net;
}

struct Run {
  std::shared_ptr<Sequential> net = make_net();
  std::unique_ptr<Trainer> trainer;
  explicit Run(uint64_t seed) {
    manual_seed(seed);
    net->initialize(Init::Xavier(), kDevices);
    trainer = std::make_unique<Trainer>(net->collect_params(), "sgd", SGDOptions{0.1f, 0.9f, 1e-3f}, "device");
  }
  // One epoch: each step's batch is fixed data plus noise drawn from the RNG, so the RNG state
  // matters for what comes next.
  void epoch(int e) {
    for (int s = 0; s < kStepsPerEpoch; ++s) {
      auto X = test::lcg_data(kBatch * kIn, static_cast<uint32_t>(100 * e + s));
      std::vector<int32_t> y;
      for (int64_t i = 0; i < kBatch; ++i) y.push_back((X[i * kIn] > 0) + (X[i * kIn + 1] > 0));
      auto Xs = split_and_load(X, {kBatch, kIn}, kDevices);
      auto ys = split_and_load(y, {kBatch}, kDevices);
      std::vector<Tensor> losses;
      for (size_t i = 0; i < Xs.size(); ++i) {
        Tensor noisy = Xs[i] + normal(Xs[i].shape(), 0.0f, 0.1f, Xs[i].device());
        losses.push_back(softmax_cross_entropy((*net)(noisy), ys[i], Reduction::sum));
      }
      for (auto& l : losses) l.backward();
      trainer->step(kBatch);
    }
  }
  // Epoch 1, then its checkpoint written to `path`.
  void first_epoch_saved_to(const std::string& path) {
    epoch(1);
    save_checkpoint(path, *net, *trainer, 1);
  }
};

// Every replica of every parameter (running statistics per device included), by name.
std::map<std::string, std::vector<std::vector<float>>> snapshot(const Block& net) {
  std::map<std::string, std::vector<std::vector<float>>> out;
  for (auto& [name, p] : net.collect_params())
    if (p->initialized())
      for (auto& t : p->list_data()) out[name].push_back(t.to_vector());
  return out;
}

bool bitwise_equal(const std::map<std::string, std::vector<std::vector<float>>>& a,
                   const std::map<std::string, std::vector<std::vector<float>>>& b) {
  if (a.size() != b.size()) return false;
  for (auto& [name, reps] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.size() != reps.size()) return false;
    for (size_t i = 0; i < reps.size(); ++i)
      if (reps[i].size() != it->second[i].size() ||
          std::memcmp(reps[i].data(), it->second[i].data(), reps[i].size() * sizeof(float)) != 0)
        return false;
  }
  return true;
}

std::string make_tmpdir() {
  std::string pattern = (fs::temp_directory_path() / "d2l_checkpoint_XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

// Sets value i of the F32 tensor `name` of f.
void set_value(SafetensorsFile& f, const std::string& name, size_t i, float value) {
  FileTensor& t = f.tensors.at(name);
  std::vector<float> v = t.floats();
  v.at(i) = value;
  t = FileTensor::from_floats(t.shape, v);
}

}  // namespace

TEST_CASE("resuming from a checkpoint continues bit for bit") {
  std::string dir = make_tmpdir();
  std::string path = dir + "/epoch1.safetensors";

  Run a(1);
  a.first_epoch_saved_to(path);
  for (auto& e : fs::directory_iterator(dir)) CHECK(e.path() == path);  // no temporary file left
  a.epoch(2);

  // The file: parameters under their names, device 1's running statistics, the trainer state, metadata.
  SafetensorsFile f = load_safetensors(path);
  for (const char* name : {"0.weight", "0.bias", "1.running_mean", "1.running_var", "2.weight", "replica/1/1.running_mean",
                           "replica/1/1.running_var", "trainer/momentum/0.weight", "trainer/momentum/1.weight",
                           "trainer/num_update", "trainer/learning_rate"})
    CHECK_MESSAGE(f.tensors.count(name), name);
  CHECK_FALSE(f.tensors.count("replica/1/0.weight"));  // trained parameters are equal on every device
  CHECK(f.metadata.at("format") == "d2l-checkpoint");
  CHECK(f.metadata.at("epoch") == "1");
  CHECK(f.metadata.at("rng_seed") == "1");
  CHECK(f.tensors.at("trainer/num_update").floats() == std::vector<float>{3});
  // Per-device running statistics really differ (each device saw its own shards).
  CHECK(f.tensors.at("1.running_mean").bytes != f.tensors.at("replica/1/1.running_mean").bytes);

  // Another seed, shapes still deferred: everything comes from the checkpoint.
  Run b(999);
  CHECK(b.net->collect_params()["0.weight"].deferred());
  CHECK(load_checkpoint(path, *b.net, *b.trainer, kDevices) == 1);
  CHECK(b.trainer->num_update() == 3);
  b.epoch(2);

  CHECK(bitwise_equal(snapshot(*a.net), snapshot(*b.net)));
  CHECK(snapshot(*b.net).at("1.running_mean").size() == 2);
  CHECK(b.trainer->num_update() == a.trainer->num_update());
  auto sa = a.trainer->state_dict(), sb = b.trainer->state_dict();
  for (auto& [key, t] : sa) {
    CAPTURE(key);
    CHECK(std::memcmp(t.values.data(), sb.at(key).values.data(), t.values.size() * sizeof(float)) == 0);
  }
  CHECK(rng_state().seed == 1);

  // The same checkpoint loads as plain parameters (trainer and replica entries are skipped).
  auto c = make_net();
  load_parameters(*c, path, {cpu(0)});
  CHECK(c->collect_params()["2.weight"].shape() == Shape{3, 8});
  fs::remove_all(dir);
}

TEST_CASE("a corrupt or mismatched checkpoint: one line naming the file; net, trainer and RNG unchanged") {
  std::string dir = make_tmpdir();
  std::string good = dir + "/good.safetensors";
  Run a(7);
  a.first_epoch_saved_to(good);
  const SafetensorsFile base = load_safetensors(good);

  // Each case: a file, and the words its error must contain.
  auto edited = [&](const std::function<void(SafetensorsFile&)>& edit) {
    SafetensorsFile f = base;
    edit(f);
    return safetensors_bytes(f);
  };
  std::string whole = read_file(good);
  struct Case {
    std::string what, bytes, message;
  };
  std::vector<Case> cases{
      {"truncated", whole.substr(0, whole.size() - 4), "go beyond the"},
      {"trailing bytes", whole + "junk", "4 trailing bytes after the last tensor"},
      {"a parameters file", edited([](SafetensorsFile& f) { f.metadata.clear(); }), "not a checkpoint"},
      {"no epoch", edited([](SafetensorsFile& f) { f.metadata.erase("epoch"); }), "checkpoint has no \"epoch\" in __metadata__"},
      {"epoch not a number", edited([](SafetensorsFile& f) { f.metadata["epoch"] = "1.5"; }),
       "__metadata__ \"epoch\" is \"1.5\", expected a whole number"},
      {"rng offset not a number", edited([](SafetensorsFile& f) { f.metadata["rng_offset"] = "-3"; }),
       "__metadata__ \"rng_offset\" is \"-3\""},
      {"a missing parameter", edited([](SafetensorsFile& f) { f.tensors.erase("2.bias"); }),
       "1 parameter of the net not in the file: '2.bias'"},
      {"a parameter of another shape", edited([](SafetensorsFile& f) {
         f.tensors["2.bias"] = FileTensor::from_floats({4}, {0, 0, 0, 0});
       }),
       "tensor '2.bias' has shape (4,) but the parameter has shape (3,)"},
      {"no trainer state", edited([](SafetensorsFile& f) { f.tensors.erase("trainer/num_update"); }), "num_update"},
      {"trainer state of another shape", edited([](SafetensorsFile& f) {
         f.tensors["trainer/momentum/2.bias"] = FileTensor::from_floats({2}, {0, 0});
       }),
       "momentum/2.bias"},
      {"trainer state not F32", edited([](SafetensorsFile& f) {
         f.tensors["trainer/num_update"] = FileTensor::from_ints(FileDtype::i64, {1}, {3});
       }),
       "trainer state 'trainer/num_update' has dtype I64, expected F32"},
      {"a replica of a trained parameter", edited([](SafetensorsFile& f) {
         f.tensors["replica/1/0.bias"] = f.tensors.at("0.bias");
       }),
       "'replica/1/0.bias' is not replica/<i>/<name> of a state of the net"},
      {"a replica of another shape", edited([](SafetensorsFile& f) {
         f.tensors["replica/1/1.running_var"] = FileTensor::from_floats({1}, {1});
       }),
       "'replica/1/1.running_var' has dtype F32 and shape (1,), expected F32 and (8,)"},
      // What the file says, not only its shape: non-finite values, integers out of range, devices.
      {"a NaN weight", edited([](SafetensorsFile& f) { set_value(f, "0.weight", 3, NAN); }),
       "tensor '0.weight' has 1 of 40 values that are not finite (the first, at index 3, is nan)"},
      {"an infinite running variance", edited([](SafetensorsFile& f) { set_value(f, "1.running_var", 0, -INFINITY); }),
       "tensor '1.running_var' has 1 of 8 values that are not finite (the first, at index 0, is -inf)"},
      {"a NaN in device 1's statistics", edited([](SafetensorsFile& f) { set_value(f, "replica/1/1.running_mean", 7, NAN); }),
       "tensor 'replica/1/1.running_mean' has 1 of 8 values that are not finite"},
      {"a NaN momentum", edited([](SafetensorsFile& f) { set_value(f, "trainer/momentum/2.bias", 1, NAN); }),
       "trainer state 'trainer/momentum/2.bias' has 1 of 3 values that are not finite"},
      {"an epoch past int", edited([](SafetensorsFile& f) { f.metadata["epoch"] = "2147483648"; }),
       "epoch 2147483648 is out of range (0 to 2147483647)"},
      {"an epoch that wraps", edited([](SafetensorsFile& f) { f.metadata["epoch"] = "18446744073709551615"; }),
       "epoch 18446744073709551615 is out of range"},
      {"an epoch past uint64", edited([](SafetensorsFile& f) { f.metadata["epoch"] = "18446744073709551616"; }),
       "expected a whole number"},
      {"no device list", edited([](SafetensorsFile& f) { f.metadata.erase("devices"); }), "checkpoint has no \"devices\""},
      {"an unknown device kind", edited([](SafetensorsFile& f) { f.metadata["devices"] = "cpu,tpu"; }),
       "\"devices\" is \"cpu,tpu\", expected device kinds (cpu, gpu, emu)"},
      {"an empty device kind", edited([](SafetensorsFile& f) { f.metadata["devices"] = "cpu,"; }), "expected device kinds"},
      {"written on 3 devices", edited([](SafetensorsFile& f) {
         f.metadata["devices"] = "cpu,cpu,cpu";
         f.tensors["replica/2/1.running_mean"] = f.tensors.at("replica/1/1.running_mean");
         f.tensors["replica/2/1.running_var"] = f.tensors.at("replica/1/1.running_var");
       }),
       "checkpoint was written on 3 devices (cpu,cpu,cpu), resuming on 2"},
      {"a replica beyond the device count", edited([](SafetensorsFile& f) {
         f.tensors["replica/2/1.running_mean"] = f.tensors.at("replica/1/1.running_mean");
       }),
       "'replica/2/1.running_mean' is beyond the 2 devices"},
      {"a replica missing", edited([](SafetensorsFile& f) { f.tensors.erase("replica/1/1.running_var"); }),
       "checkpoint of 2 devices has no 'replica/1/1.running_var'"},
  };

  Run b(8);
  b.epoch(1);  // a net and trainer with state of their own, different from the file's
  b.epoch(2);
  auto net_before = snapshot(*b.net);
  auto trainer_before = b.trainer->state_dict();
  RngState rng_before = rng_state();
  for (auto& c : cases) {
    CAPTURE(c.what);
    std::string path = dir + "/bad.safetensors";
    write_file_atomic(path, {c.bytes});
    std::string message;
    try {
      load_checkpoint(path, *b.net, *b.trainer, kDevices);
    } catch (const std::exception& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(bitwise_equal(snapshot(*b.net), net_before));
    CHECK(b.trainer->num_update() == 6);
    auto now = b.trainer->state_dict();
    for (auto& [key, t] : trainer_before) CHECK(now.at(key).values == t.values);
    CHECK(rng_state().seed == rng_before.seed);
    CHECK(rng_state().offset == rng_before.offset);
  }
  CHECK(base.metadata.at("devices") == "cpu,cpu");
  // Resuming on one device would drop device 1's running statistics: refused, nothing changed.
  Run one(3);
  auto one_before = snapshot(*one.net);
  CHECK_THROWS_WITH_AS(load_checkpoint(good, *one.net, *one.trainer, {cpu(0)}),
                       doctest::Contains("written on 2 devices (cpu,cpu), resuming on 1"), std::runtime_error);
  CHECK(bitwise_equal(snapshot(*one.net), one_before));
  // Its parameters alone still load (device 0's replica, running statistics included).
  load_parameters(*one.net, good, {cpu(0)});
  CHECK(one.net->collect_params()["1.running_mean"].data(cpu(0)).to_vector() == base.tensors.at("1.running_mean").floats());
  // A negative epoch is refused when saving.
  CHECK_THROWS_WITH_AS(save_checkpoint(dir + "/x.safetensors", *a.net, *a.trainer, -1), doctest::Contains("epoch -1 is negative"),
                       ParameterError);
  fs::remove_all(dir);
}
