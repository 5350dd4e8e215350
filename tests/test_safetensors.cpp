// safetensors files (core/io): bitwise round trips, the writer's header checked byte by byte against
// hand-computed bytes, a hand-written file in PyTorch's state_dict naming loaded into a matching
// net, one table of corrupt files (each gives its one-line error and leaves the net unchanged),
// atomic writes that fail cleanly (missing directory, full disk, read-only file system, file size
// limit) with the previous file intact and no temporary file left, and, when Debian's python3 has
// PyTorch, files exchanged with PyTorch both ways (tests/safetensors_torch.py).
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>

#include "core/checkpoint/parameters_file.hpp"
#include "core/rng.hpp"
#include "kernels/cpu/float16.hpp"
#include "core/runtime.hpp"
#include "tests/check.hpp"

using namespace d2l;
using namespace d2l::io;
using nn::Block;
using nn::ParameterPtr;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// PyTorch's nn.Linear layout: weight (out, in), bias (out); in = 0 waits for its shape.
struct Linear : Block {
  ParameterPtr weight, bias;
  Linear(int64_t out, int64_t in) {
    weight = register_parameter("weight", {out, in});
    bias = register_parameter("bias", {out}, Init::Zero());
  }
  Tensor forward(const Tensor& x) override { return x; }  // not used: only the parameters matter here
  std::string type() const override { return "Linear"; }
};

// PyTorch's nn.BatchNorm1d parameters: weight, bias, and two states without a gradient.
struct Norm : Block {
  Norm(int64_t c) {
    register_parameter("weight", {c}, Init::One());
    register_parameter("bias", {c}, Init::Zero());
    register_parameter("running_mean", {c}, Init::Zero(), false);
    register_parameter("running_var", {c}, Init::One(), false);
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string type() const override { return "Norm"; }
};

// nn.Sequential(nn.Linear(in, out), nn.BatchNorm1d(out)): names 0.weight, 0.bias, 1.weight, ...
struct Net : Block {
  Net(int64_t out, int64_t in) {
    register_child("0", std::make_shared<Linear>(out, in));
    register_child("1", std::make_shared<Norm>(out));
  }
  Tensor forward(const Tensor& x) override { return x; }
  std::string type() const override { return "Net"; }
};

std::string make_tmpdir() {
  std::string pattern = (fs::temp_directory_path() / "d2l_safetensors_XXXXXX").string();
  REQUIRE(mkdtemp(pattern.data()) != nullptr);
  return pattern;
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(f.good());
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

// A file as the format lays it out, with nothing checked: tests can lie.
std::string file_of(const std::string& header, const std::string& data) { return le64(header.size()) + header + data; }

std::string floats_bytes(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
}

// Names of temporary files left in a directory by write_file_atomic.
std::vector<std::string> temp_files(const std::string& dir) {
  std::vector<std::string> out;
  for (auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().find(".tmp.") != std::string::npos) out.push_back(e.path().string());
  return out;
}

// Every parameter's values on every device it lives on, by name.
std::map<std::string, std::vector<std::vector<float>>> snapshot(const Block& net) {
  std::map<std::string, std::vector<std::vector<float>>> out;
  for (auto& [name, p] : net.collect_params())
    for (auto& t : p->list_data()) out[name].push_back(t.to_vector());
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("the writer's bytes, computed by hand") {
  // Empty: the header "{}" padded with 6 spaces to 8 bytes.
  CHECK(safetensors_bytes({}) == le64(8) + "{}      ");

  // "b" F32 (2,) = {1, 2}; "a" I64 () = 7; metadata epoch = "12". The I64 tensor comes first (larger
  // dtypes first, then names). Header lengths, counted by hand:
  //   {"__metadata__":{"epoch":"12"},                      1 + 14 + 1 + 14 + 1 = 31
  //   "a":{"dtype":"I64","shape":[],"data_offsets":[0,8]},  3 + 1 + 47 + 1    = 52   (83)
  //   "b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]} 3 + 1 + 49        = 53   (136)
  //   }                                                                         1    (137)
  // 137 bytes, padded with 7 spaces to 144 = 0x90.
  SafetensorsFile f;
  f.tensors["b"] = FileTensor::from_floats({2}, {1.0f, 2.0f});
  f.tensors["a"] = FileTensor::from_ints(FileDtype::i64, {}, {7});
  f.metadata["epoch"] = "12";
  std::string expected_json =
      "{\"__metadata__\":{\"epoch\":\"12\"},\"a\":{\"dtype\":\"I64\",\"shape\":[],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}";
  REQUIRE(expected_json.size() == 137);
  std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + expected_json + "       " +
                         std::string("\x07\0\0\0\0\0\0\0", 8) +       // 7 as int64, little-endian
                         std::string("\x00\x00\x80\x3f", 4) +         // 1.0f = 0x3f800000
                         std::string("\x00\x00\x00\x40", 4);          // 2.0f = 0x40000000
  CHECK(safetensors_header(f) == expected.substr(0, 8 + 144));
  CHECK(safetensors_bytes(f) == expected);
  CHECK(expected.size() == 168);

  // The data of every tensor starts 8-byte aligned in the file.
  CHECK((8 + 144) % 8 == 0);
  // Names are escaped as JSON strings.
  SafetensorsFile g;
  g.tensors["a\"b\\c"] = FileTensor::from_floats({1}, {0.0f});
  CHECK(safetensors_header(g).substr(8).rfind("{\"a\\\"b\\\\c\":{", 0) == 0);
  // What the format cannot hold is refused before anything is written.
  SafetensorsFile bad;
  bad.tensors["\xff"] = FileTensor::from_floats({1}, {0.0f});
  CHECK_THROWS_WITH_AS(safetensors_bytes(bad), "safetensors: the name '\\xff' is not valid UTF-8", FileError);
  bad.tensors = {{"__metadata__", FileTensor::from_floats({1}, {0.0f})}};
  CHECK_THROWS_WITH_AS(safetensors_bytes(bad), "safetensors: a tensor cannot be named '__metadata__'", FileError);
  bad.tensors = {{"x", FileTensor{FileDtype::f32, {3}, std::vector<unsigned char>(8)}}};
  CHECK_THROWS_WITH_AS(safetensors_bytes(bad), "safetensors: tensor 'x' holds 8 bytes but shape (3,) of F32 needs 12", FileError);
}

TEST_CASE("round trip: bitwise, several shapes and dtypes, through a file") {
  std::string dir = make_tmpdir();
  SafetensorsFile f;
  std::vector<Shape> shapes{{4, 3}, {3}, {}, {2, 3, 4, 5}, {0, 3}, {1, 1, 1}, {7, 1}};
  for (size_t i = 0; i < shapes.size(); ++i) {
    std::vector<float> v = test::lcg_data(numel(shapes[i]), static_cast<uint32_t>(100 + i));
    if (!v.empty()) v[0] = i % 2 ? -0.0f : std::numeric_limits<float>::denorm_min();
    f.tensors["layer" + std::to_string(i) + ".weight"] = FileTensor::from_floats(shapes[i], v);
  }
  std::vector<float> special{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                             std::numeric_limits<float>::quiet_NaN(), std::nanf("0x1234"), 1e-45f, -3.4e38f};
  f.tensors["special"] = FileTensor::from_floats({2, 3}, special);
  f.tensors["labels"] = FileTensor::from_ints(FileDtype::i32, {5}, {0, -1, 2147483647, -2147483648LL, 9});
  f.tensors["bn.num_batches_tracked"] = FileTensor::from_ints(FileDtype::i64, {}, {123456789012345LL});
  // 16-bit floats: every class (zeros, a subnormal, 1, the largest, infinity, NaNs with payloads).
  const std::vector<uint16_t> halves{0x0000, 0x8000, 0x0001, 0x3C00, 0x7BFF, 0xFC00, 0x7E01, 0xFFFF};
  f.tensors["half.bf16"] = FileTensor::from_bits16(FileDtype::bf16, {2, 4}, halves);
  f.tensors["half.f16"] = FileTensor::from_bits16(FileDtype::f16, {8}, halves);
  f.metadata = {{"format", "pt"}, {"note", "line\nbreak \"quoted\" \xc3\xa9"}};

  std::string path = dir + "/round.safetensors";
  save_safetensors(path, f);
  CHECK(temp_files(dir).empty());
  SafetensorsFile g = load_safetensors(path);
  CHECK(g.metadata == f.metadata);
  REQUIRE(g.tensors.size() == f.tensors.size());
  for (auto& [name, t] : f.tensors) {
    CAPTURE(name);
    REQUIRE(g.tensors.count(name));
    CHECK(g.tensors[name].dtype == t.dtype);
    CHECK(g.tensors[name].shape == t.shape);
    CHECK(g.tensors[name].bytes == t.bytes);  // bitwise: NaN payloads, -0, denormals included
  }
  CHECK(g.tensors["labels"].ints() == std::vector<int64_t>{0, -1, 2147483647, -2147483648LL, 9});
  CHECK(g.tensors["bn.num_batches_tracked"].ints() == std::vector<int64_t>{123456789012345LL});
  CHECK(g.tensors["half.f16"].bits16() == halves);
  // floats() widens 16-bit values exactly: float16 0x3C00 is 1, 0x7BFF 65504, 0x0001 2^-24; bfloat16
  // 0x3C00 is 2^-7, 0x7BFF 0x7BFF0000's float.
  const std::vector<float> f16 = g.tensors["half.f16"].floats(), bf16 = g.tensors["half.bf16"].floats();
  CHECK(f16[3] == 1.0f);
  CHECK(f16[4] == 65504.0f);
  CHECK(f16[2] == std::ldexp(1.0f, -24));
  CHECK(std::isinf(f16[5]));
  CHECK(std::isnan(f16[6]));
  CHECK(bf16[3] == std::ldexp(1.0f, -7));
  CHECK(bf16[4] == std::bit_cast<float>(0x7BFF0000u));
  CHECK_THROWS_WITH_AS(g.tensors["labels"].floats(), "tensor has dtype I32, expected F32, BF16 or F16", FileError);
  CHECK_THROWS_WITH_AS(g.tensors["special"].bits16(), "tensor has dtype F32, expected BF16 or F16", FileError);
  // Writing what was read gives the same bytes again.
  CHECK(safetensors_bytes(g) == read_file(path));
  fs::remove_all(dir);
}

TEST_CASE("the writer orders dtypes as the reference does: I64, F32, I32, BF16, F16, then names") {
  SafetensorsFile f;
  f.tensors["a"] = FileTensor::from_bits16(FileDtype::f16, {1}, {0x3C00});
  f.tensors["b"] = FileTensor::from_bits16(FileDtype::bf16, {1}, {0x3F80});
  f.tensors["c"] = FileTensor::from_ints(FileDtype::i32, {1}, {3});
  f.tensors["d"] = FileTensor::from_floats({1}, {4.0f});
  f.tensors["e"] = FileTensor::from_ints(FileDtype::i64, {1}, {5});
  f.tensors["f"] = FileTensor::from_bits16(FileDtype::f16, {1}, {0x4000});
  const std::string h = safetensors_header(f);
  std::vector<size_t> at;
  for (const char* name : {"\"e\"", "\"d\"", "\"c\"", "\"b\"", "\"a\"", "\"f\""}) at.push_back(h.find(name));
  CHECK(std::is_sorted(at.begin(), at.end()));
  CHECK(h.find(R"("b":{"dtype":"BF16","shape":[1],"data_offsets":[16,18]})") != std::string::npos);
  CHECK(h.find(R"("f":{"dtype":"F16","shape":[1],"data_offsets":[20,22]})") != std::string::npos);
}

TEST_CASE("a hand-written file in PyTorch's naming loads into a matching net, shapes inferred") {
  // nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).state_dict(), as safetensors.torch writes it
  // (I64 first, then the F32 tensors by name).
  std::vector<float> w(12), b(4), g(4), beta(4), mean(4), var(4);
  for (int i = 0; i < 12; ++i) w[i] = 0.5f * static_cast<float>(i) - 2.0f;
  for (int i = 0; i < 4; ++i) b[i] = 0.25f * i, g[i] = 1.0f + i, beta[i] = -0.125f * i, mean[i] = 3.0f - i, var[i] = 0.5f + i;
  std::string header =
      R"({"1.num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
      R"("0.bias":{"dtype":"F32","shape":[4],"data_offsets":[8,24]},)"
      R"("0.weight":{"dtype":"F32","shape":[4,3],"data_offsets":[24,72]},)"
      R"("1.bias":{"dtype":"F32","shape":[4],"data_offsets":[72,88]},)"
      R"("1.running_mean":{"dtype":"F32","shape":[4],"data_offsets":[88,104]},)"
      R"("1.running_var":{"dtype":"F32","shape":[4],"data_offsets":[104,120]},)"
      R"("1.weight":{"dtype":"F32","shape":[4],"data_offsets":[120,136]}})";
  std::string data = le64(42) + floats_bytes(b) + floats_bytes(w) + floats_bytes(beta) + floats_bytes(mean) +
                     floats_bytes(var) + floats_bytes(g);
  std::string dir = make_tmpdir();
  std::string path = dir + "/torch_named.safetensors";
  write_bytes(path, file_of(header, data));

  manual_seed(5);
  take_offset(17);
  RngState before = rng_state();
  Net net(4, 0);  // in_features still unknown (deferred)
  net.initialize(Init::Normal(1.0f), {cpu(0)});
  auto params = net.collect_params();
  CHECK(params["0.weight"].deferred());
  load_parameters(net, path, {cpu(0), cpu(1)});
  CHECK(params["0.weight"].shape() == Shape{4, 3});
  std::map<std::string, std::vector<float>> want{{"0.weight", w}, {"0.bias", b},         {"1.weight", g},
                                                 {"1.bias", beta}, {"1.running_mean", mean}, {"1.running_var", var}};
  for (auto& [name, v] : want) {
    CAPTURE(name);
    REQUIRE(params[name].list_ctx() == std::vector<Device>{cpu(0), cpu(1)});
    CHECK(same_bits(params[name].data(cpu(0)).to_vector(), v));
    CHECK(same_bits(params[name].data(cpu(1)).to_vector(), v));
  }
  // Trainable parameters keep their gradients; the loaded net draws no random numbers.
  CHECK(params["0.weight"].grad(cpu(1)).defined());
  CHECK_FALSE(params["1.running_mean"].data(cpu(1)).grad().defined());
  CHECK(rng_state().seed == before.seed);
  CHECK(rng_state().offset == before.offset);

  // A net never initialised is made on the devices given, here emulated GPUs.
  Net fresh(4, 3);
  load_parameters(fresh, path, {emu(0), emu(1)});
  for (auto& [name, v] : want) CHECK(same_bits(fresh.collect_params()[name].data(emu(1)).to_vector(), v));
  CHECK(rng_state().offset == before.offset);
  fs::remove_all(dir);
}

TEST_CASE("save_parameters writes device 0's replica under the dotted names; load gives it back bitwise") {
  std::string dir = make_tmpdir();
  manual_seed(3);
  Net net(5, 3);
  net.initialize(Init::Xavier(), {cpu(0), cpu(1)});
  auto params = net.collect_params();
  // Running statistics are kept per device: device 1's differ, and the file holds device 0's.
  Tensor other = Tensor::from_vector(std::vector<float>{9, 9, 9, 9, 9}, {5}, cpu(1));
  other.copyto(params["1.running_mean"].data(cpu(1)));
  params["1.running_mean"].data(cpu(0)).copyto(params["1.running_var"].data(cpu(0)));
  std::string path = dir + "/net.safetensors";
  save_parameters(net, path);
  CHECK(temp_files(dir).empty());

  SafetensorsFile f = load_safetensors(path);
  std::vector<std::string> names;
  for (auto& [n, t] : f.tensors) names.push_back(n);
  CHECK(names == std::vector<std::string>{"0.bias", "0.weight", "1.bias", "1.running_mean", "1.running_var", "1.weight"});
  CHECK(f.metadata.empty());
  for (auto& [name, p] : params) {
    CAPTURE(name);
    CHECK(f.tensors[name].dtype == FileDtype::f32);
    CHECK(f.tensors[name].shape == p->shape());
    CHECK(same_bits(f.tensors[name].floats(), p->data(cpu(0)).to_vector()));
  }

  Net copy(5, 0);
  load_parameters(copy, path);  // Gluon's default context, cpu(0)
  auto copied = copy.collect_params();
  for (auto& [name, p] : params) CHECK(same_bits(copied[name].data(cpu(0)).to_vector(), p->data(cpu(0)).to_vector()));
  CHECK_THROWS_WITH_AS(copied["0.weight"].data(cpu(1)), doctest::Contains("was not initialized on context cpu(1)"),
                       ParameterError);
  // A net that is not initialised cannot be saved: the book's error.
  Net empty(2, 0);
  empty.initialize(Init::Uniform(), {cpu(0)});
  CHECK_THROWS_WITH_AS(save_parameters(empty, dir + "/x.safetensors"), doctest::Contains("deferred"), ParameterError);
  CHECK_FALSE(fs::exists(dir + "/x.safetensors"));
  fs::remove_all(dir);
}

TEST_CASE("corrupt files: one line naming the file and the problem; the net is unchanged") {
  // A valid file for Net(2, 2): six F32 tensors of 2 or 4 values, 56 data bytes.
  auto good = [] {
    json j;
    auto entry = [](Shape s, uint64_t b, uint64_t e) { return json{{"dtype", "F32"}, {"shape", s}, {"data_offsets", {b, e}}}; };
    j["0.bias"] = entry({2}, 0, 8);
    j["0.weight"] = entry({2, 2}, 8, 24);
    j["1.bias"] = entry({2}, 24, 32);
    j["1.running_mean"] = entry({2}, 32, 40);
    j["1.running_var"] = entry({2}, 40, 48);
    j["1.weight"] = entry({2}, 48, 56);
    return j;
  };
  auto data = [](size_t n) { return floats_bytes(test::lcg_data(static_cast<int64_t>(n / 4), 7)); };
  auto with = [&](std::function<void(json&)> edit, size_t data_bytes = 56) {
    json j = good();
    edit(j);
    return file_of(j.dump(), data(data_bytes));
  };
  auto with_value = [&](size_t at, float v) {
    auto d = test::lcg_data(14, 7);
    d.at(at) = v;
    return file_of(good().dump(), floats_bytes(d));
  };
  auto prefixed = [&](const std::string& prefix) {
    json g = good(), j;
    for (auto& [k, v] : g.items()) j[prefix + k] = v;
    return j;
  };
  const uint64_t big = uint64_t{1} << 62;
  struct Case {
    const char* what;
    std::string bytes;
    std::string message;
    bool format_error;  // FileError (the file is malformed) or ParameterError (it does not fit the net)
  };
  std::vector<Case> cases{
      {"too short", std::string("\x05\0\0", 3), "file is 3 bytes, too short for a safetensors file", true},
      {"absurd header length", le64(uint64_t{1} << 40) + "{}", "header length 1099511627776 is absurd", true},
      {"header beyond the file", le64(100) + "{}      ", "header length 100 goes beyond the end of the file (8 + 100 > 16 bytes)", true},
      {"invalid JSON", file_of("{\"0.bias\": ", ""), "header is not valid JSON: parse error", true},
      {"not UTF-8", file_of("{\"\xff\xfe\":1}", ""), "header is not valid JSON", true},
      {"not an object", file_of("[1, 2]", ""), "header is a JSON array, expected an object", true},
      {"a name twice", file_of(R"({"0.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"0.bias":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data(8)),
       "header names '0.bias' twice", true},
      {"entry not an object", with([](json& j) { j["0.bias"] = 5; }), "tensor '0.bias' is not an object", true},
      {"no dtype", with([](json& j) { j["0.bias"].erase("dtype"); }), "tensor '0.bias' has no \"dtype\"", true},
      {"no shape", with([](json& j) { j["1.weight"].erase("shape"); }), "tensor '1.weight' has no \"shape\"", true},
      {"no data_offsets", with([](json& j) { j["0.weight"].erase("data_offsets"); }), "tensor '0.weight' has no \"data_offsets\"", true},
      {"unknown dtype", with([](json& j) { j["0.bias"]["dtype"] = "F33"; }), "tensor '0.bias' has an unknown dtype 'F33'", true},
      {"dtype not read", with([](json& j) { j["0.bias"]["dtype"] = "F64"; }), "tensor '0.bias' has dtype F64, which this reader does not take", true},
      {"dtype not a string", with([](json& j) { j["0.bias"]["dtype"] = 32; }), "tensor '0.bias': dtype is not a string (32)", true},
      {"negative dimension", with([](json& j) { j["0.bias"]["shape"] = {-2}; }), "tensor '0.bias': shape [-2] entry 0 is negative (-2)", true},
      {"fractional dimension", with([](json& j) { j["0.bias"]["shape"] = {2.5}; }), "entry 0 is not a whole number (2.5)", true},
      {"shape not a list", with([](json& j) { j["0.bias"]["shape"] = "2"; }), "tensor '0.bias': shape is not a list", true},
      {"overflowing shape", with([&](json& j) { j["0.bias"]["shape"] = {big, big}; }), "is too large to be stored", true},
      {"offsets do not match the shape", with([](json& j) { j["0.bias"]["shape"] = {3}; }),
       "tensor '0.bias': data_offsets [0, 8] hold 8 bytes, but shape (3,) of F32 needs 12", true},
      {"offsets not a pair", with([](json& j) { j["0.bias"]["data_offsets"] = {0, 4, 8}; }), "data_offsets is not a pair", true},
      {"offsets backwards", with([](json& j) { j["0.bias"]["data_offsets"] = {8, 0}; }), "tensor '0.bias': data_offsets [8, 0] run backwards", true},
      {"negative offset", with([](json& j) { j["0.bias"]["data_offsets"] = {-8, 0}; }), "data_offsets begin is negative (-8)", true},
      {"offsets beyond the data", with([](json& j) { j["1.weight"] = {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {48, 64}}}; }),
       "tensor '1.weight': data_offsets [48, 64] go beyond the 56 bytes of data", true},
      {"overlapping tensors", with([](json& j) { j["0.weight"]["data_offsets"] = {4, 20}; }),
       "tensor '0.weight' (bytes [4, 20]) overlaps tensor '0.bias' (bytes [0, 8])", true},
      {"a gap", with([](json& j) { j["1.weight"]["data_offsets"] = {52, 60}; }, 60),
       "4 bytes of gap before tensor '1.weight' (it begins at 52, the data before it ends at 48)", true},
      {"trailing bytes", with([](json&) {}, 60), "4 trailing bytes after the last tensor (the tensors cover 56 of 60 data bytes)", true},
      {"metadata not strings", with([](json& j) { j["__metadata__"] = {{"epoch", 1}}; }),
       "__metadata__ value of 'epoch' is not a string (1)", true},
      {"metadata not an object", with([](json& j) { j["__metadata__"] = "pt"; }), "__metadata__ is not an object of strings", true},
      {"a missing tensor", with([](json& j) { j.erase("1.weight"); }, 48), "1 parameter of the net not in the file: '1.weight'", false},
      {"an unexpected tensor", with([](json& j) { j["2.weight"] = {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {56, 64}}}; }, 64),
       "1 tensor in the file that the net does not have: '2.weight'", false},
      {"num_batches_tracked that is not I64", with([](json& j) { j["1.num_batches_tracked"] = {{"dtype", "F32"}, {"shape", json::array()}, {"data_offsets", {56, 60}}}; }, 60),
       "the net does not have: '1.num_batches_tracked'", false},
      {"dtype mismatch", with([](json& j) { j["0.bias"]["dtype"] = "I32"; }), "tensor '0.bias' has dtype I32, the parameter needs F32, BF16 or F16", false},
      {"shape mismatch", with([](json& j) { j["0.weight"]["shape"] = {4}; }), "tensor '0.weight' has shape (4,) but the parameter has shape (2, 2)", false},
      // What the values say: a NaN weight, an infinite running variance (floats 3 and 10 of the data).
      {"a NaN weight", with_value(3, NAN), "tensor '0.weight' has 1 of 4 values that are not finite (the first, at index 1, is nan)", false},
      {"an infinite variance", with_value(10, INFINITY), "tensor '1.running_var' has 1 of 2 values that are not finite (the first, at index 0, is inf)", false},
      // PyTorch's DataParallel names: a hint, not six missing names.
      {"module. prefix", file_of(prefixed("module.").dump(), data(56)), "its names start with 'module.'", false},
      {"another prefix", file_of(prefixed("model.").dump(), data(56)), "6 parameters of the net not in the file", false},
  };

  std::string dir = make_tmpdir();
  std::string ok_path = dir + "/ok.safetensors";
  write_bytes(ok_path, file_of(good().dump(), data(56)));
  Net net(2, 0);
  net.initialize(Init::Uniform(), {cpu(0), cpu(1)});
  load_parameters(net, ok_path, {cpu(0), cpu(1)});  // the good file itself loads
  auto before = snapshot(net);
  for (auto& c : cases) {
    std::string what = c.what;
    CAPTURE(what);
    std::string path = dir + "/bad.safetensors";
    write_bytes(path, c.bytes);
    std::string message;
    bool format_error = false;
    try {
      load_parameters(net, path, {cpu(0), cpu(1)});
    } catch (const FileError& e) {
      message = e.what(), format_error = true;
    } catch (const ParameterError& e) {
      message = e.what();
    }
    CAPTURE(message);
    CHECK(message.rfind(path + ": ", 0) == 0);
    CHECK(message.find(c.message) != std::string::npos);
    CHECK(message.find('\n') == std::string::npos);
    CHECK(format_error == c.format_error);
    CHECK(snapshot(net) == before);
  }
  // A deferred shape that the file contradicts: the parameter's known entries are named.
  Net wrong(5, 0);
  wrong.initialize(Init::Uniform(), {cpu(0)});
  CHECK_THROWS_WITH_AS(load_parameters(wrong, ok_path),
                       (ok_path + ": tensor '0.weight' has shape (2, 2) but the parameter has shape (5, ?)").c_str(),
                       ParameterError);
  CHECK(wrong.collect_params()["0.weight"].deferred());
  Net wrong_in(2, 3);
  CHECK_THROWS_WITH_AS(load_parameters(wrong_in, ok_path), doctest::Contains("tensor '0.weight' has shape (2, 2) but the parameter has shape (2, 3)"),
                       ParameterError);
  Net deferred(3, 0);
  deferred.initialize(Init::Uniform(), {cpu(0)});
  CHECK_THROWS_AS(load_parameters(deferred, dir + "/missing.safetensors"), FileError);
  CHECK_THROWS_WITH_AS(load_parameters(deferred, dir + "/missing.safetensors"),
                       (dir + "/missing.safetensors: cannot open: No such file or directory").c_str(), FileError);
  CHECK_THROWS_WITH_AS(load_parameters(deferred, dir), (dir + ": cannot read: Is a directory").c_str(), FileError);
  fs::remove_all(dir);
}

TEST_CASE("a killed writer's temporary file is named for it and removed by the next writer of the target") {
  std::string dir = make_tmpdir();
  std::string path = dir + "/ck.safetensors";
  // A process that has exited: its pid names no process now.
  pid_t dead = fork();
  REQUIRE(dead >= 0);
  if (dead == 0) _exit(0);
  REQUIRE(waitpid(dead, nullptr, 0) == dead);
  char host[256] = {};
  REQUIRE(gethostname(host, sizeof host - 1) == 0);
  const std::string me = host, d = std::to_string(dead), alive = std::to_string(getpid());
  auto make = [&](const std::string& name) {
    write_bytes(dir + "/" + name, "half a checkpoint");
    return dir + "/" + name;
  };
  std::string stale = make(".ck.safetensors.tmp." + me + "." + d + ".0");
  std::string stale_old = make(".ck.safetensors.tmp." + d + ".3");          // the older names, without a host
  std::string running = make(".ck.safetensors.tmp." + me + "." + alive + ".9");  // a writer that still runs
  std::string elsewhere = make(".ck.safetensors.tmp.other-host." + d + ".0");   // another machine's writer
  std::string other_target = make(".other.safetensors.tmp." + me + "." + d + ".0");
  // The up-front check of an output place removes them (and leaves no probe of its own) ...
  CHECK(why_not_writable(path) == "");
  CHECK_FALSE(fs::exists(stale));
  CHECK_FALSE(fs::exists(stale_old));
  CHECK(fs::exists(running));
  CHECK(fs::exists(elsewhere));
  CHECK(fs::exists(other_target));
  CHECK(temp_files(dir).size() == 3);
  // ... and so does a write.
  stale = make(".ck.safetensors.tmp." + me + "." + d + ".1");
  write_file_atomic(path, {"new"});
  CHECK_FALSE(fs::exists(stale));
  CHECK(read_file(path) == "new");
  CHECK(temp_files(dir).size() == 3);
  // The temporary names say whose they are.
  std::string name = fs::path(temporary_name(path)).filename().string();
  CHECK(name.rfind(".ck.safetensors.tmp." + me + "." + alive + ".", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("why_not_writable creates the temporary file itself, so places access() passes can fail") {
  std::string dir = make_tmpdir();
  CHECK(why_not_writable(dir + "/a.png") == "");
  CHECK(temp_files(dir).empty());
  CHECK(why_not_writable(dir + "/no/a.png") == "directory '" + dir + "/no' does not exist");
  CHECK(why_not_writable(dir) == "it is a directory");
  CHECK(why_not_writable(dir + "/") == "not a file name");
  fs::create_directory(dir + "/sub");
  CHECK(why_not_writable(dir + "/sub") == "it is a directory");
  CHECK(why_not_writable("") == "the file name is empty");
  // /proc cannot hold new files, even for root (whom access(W_OK) lets through).
  std::string proc = why_not_writable("/proc/d2l-test.png");
  CAPTURE(proc);
  CHECK(proc.rfind("cannot create a file in '/proc': ", 0) == 0);
  fs::remove_all(dir);
}

TEST_CASE("atomic writes: a failed write names the path and the reason, the previous file survives") {
  std::string dir = make_tmpdir();
  std::string path = dir + "/params.safetensors";
  write_file_atomic(path, {"old ", "contents"});
  CHECK(read_file(path) == "old contents");
  write_file_atomic(path, {"new"});
  CHECK(read_file(path) == "new");
  CHECK(temp_files(dir).empty());

  auto error_of = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const FileError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  // A missing directory, a file where a directory is expected, a directory where the file goes.
  CHECK(error_of([&] { write_file_atomic(dir + "/nope/x.safetensors", {"x"}); }) ==
        dir + "/nope/x.safetensors: cannot create a temporary file in '" + dir + "/nope': No such file or directory");
  CHECK(error_of([&] { write_file_atomic(path + "/x.safetensors", {"x"}); }) ==
        path + "/x.safetensors: cannot create a temporary file in '" + path + "': Not a directory");
  fs::create_directory(dir + "/sub");
  CHECK(error_of([&] { write_file_atomic(dir + "/sub", {"x"}); }) == dir + "/sub: cannot replace the file: Is a directory");
  CHECK(fs::is_directory(dir + "/sub"));
  CHECK(error_of([&] { write_file_atomic(dir + "/", {"x"}); }) == dir + "/: cannot write: not a file name");
  CHECK(temp_files(dir).empty());

  // save_parameters goes through the same path: a missing directory fails before anything is written.
  Net net(2, 2);
  net.initialize(Init::Uniform(), {cpu(0)});
  CHECK_THROWS_WITH_AS(save_parameters(net, dir + "/nope/net.safetensors"), doctest::Contains("No such file or directory"),
                       FileError);

  // A write that fails half way: the file size limit (RLIMIT_FSIZE) makes write() fail with EFBIG
  // after 64 KiB, as a full disk fails it with ENOSPC. The old file stays and no temporary is left.
  save_parameters(net, path);
  std::string saved = read_file(path);
  struct rlimit old_limit {};
  REQUIRE(getrlimit(RLIMIT_FSIZE, &old_limit) == 0);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);  // otherwise the process is killed instead of write() failing
  struct rlimit small = old_limit;
  small.rlim_cur = 64 * 1024;
  REQUIRE(setrlimit(RLIMIT_FSIZE, &small) == 0);
  std::string big(1 << 20, 'x');
  std::string message = error_of([&] { write_file_atomic(path, {"header", big}); });
  Net large(512, 512);
  large.initialize(Init::Uniform(), {cpu(0)});
  std::string message_params = error_of([&] { save_parameters(large, path); });
  setrlimit(RLIMIT_FSIZE, &old_limit);
  signal(SIGXFSZ, old_handler);
  CHECK(message == path + ": cannot write: File too large");
  CHECK(message_params == path + ": cannot write: File too large");
  CHECK(read_file(path) == saved);
  CHECK(temp_files(dir).empty());
  Net back(2, 2);
  load_parameters(back, path);
  CHECK(snapshot(back) == snapshot(net));
  fs::remove_all(dir);
}

namespace {

// In a child process with a mount namespace of its own: a 64 KiB tmpfs that fills up, then the
// same tmpfs read-only. Returns 0 when every check passes, 77 when mounting is not allowed here
// (not root), another number naming the failed check.
int full_and_read_only_child(const std::string& dir) {
  if (unshare(CLONE_NEWNS) != 0) return 77;
  if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 77;
  std::string mnt = dir + "/mnt";
  if (mkdir(mnt.c_str(), 0755) != 0) return 2;
  if (mount("tmpfs", mnt.c_str(), "tmpfs", 0, "size=64k") != 0) return 77;
  std::string path = mnt + "/params.safetensors";
  auto fail = [](int code, const std::string& what) {
    std::fprintf(stderr, "full_and_read_only_child: %s\n", what.c_str());
    return code;
  };
  try {
    write_file_atomic(path, {"old"});
  } catch (const FileError& e) {
    return fail(3, e.what());
  }
  std::string big(256 * 1024, 'x');
  try {
    write_file_atomic(path, {big});
    return fail(4, "a 256 KiB write into a 64 KiB tmpfs succeeded");
  } catch (const FileError& e) {
    if (std::string(e.what()) != path + ": cannot write: No space left on device") return fail(5, e.what());
  }
  if (read_file(path) != "old") return fail(6, "the previous file changed");
  for (auto& e : fs::directory_iterator(mnt))
    if (e.path() != path) return fail(7, "left behind: " + e.path().string());
  if (mount(nullptr, mnt.c_str(), nullptr, MS_REMOUNT | MS_RDONLY, nullptr) != 0) return fail(8, "remount read-only");
  try {
    write_file_atomic(path, {"new"});
    return fail(9, "a write into a read-only file system succeeded");
  } catch (const FileError& e) {
    if (std::string(e.what()) != path + ": cannot create a temporary file in '" + mnt + "': Read-only file system")
      return fail(10, e.what());
  }
  if (read_file(path) != "old") return fail(11, "the previous file changed");
  return 0;
}

// Whether this process may mount a tmpfs of its own (root, and a kernel that lets it unshare its
// mount namespace): tried once, in a child, when the test cases are registered.
bool may_mount_tmpfs() {
  std::string dir = (fs::temp_directory_path() / "d2l_mount_probe_XXXXXX").string();
  if (!mkdtemp(dir.data())) return false;
  std::fflush(nullptr);
  pid_t pid = fork();
  if (pid < 0) return false;
  if (pid == 0) {
    bool ok = unshare(CLONE_NEWNS) == 0 && mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
              mount("tmpfs", dir.c_str(), "tmpfs", 0, "size=64k") == 0;
    _exit(ok ? 0 : 77);
  }
  int status = 0;
  bool ok = waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  fs::remove_all(dir);
  return ok;
}

}  // namespace

// Skipped (reported as such) where mounting is not allowed; the RLIMIT_FSIZE case above always runs.
TEST_CASE("a full disk and a read-only file system (a 64 KiB tmpfs)" * doctest::skip(!may_mount_tmpfs())) {
  std::string dir = make_tmpdir();
  std::fflush(nullptr);
  pid_t pid = fork();
  REQUIRE(pid >= 0);
  if (pid == 0) _exit(full_and_read_only_child(dir));
  int status = 0;
  REQUIRE(waitpid(pid, &status, 0) == pid);
  REQUIRE(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);  // 77: the mount failed although the probe's succeeded
  fs::remove_all(dir);
}

namespace {

// The values the script expects: BASE[name] + i / 8, or their negatives.
std::vector<float> script_values(const std::string& name, int64_t n, float sign) {
  static const std::map<std::string, float> base{{"0.weight", 0},  {"0.bias", 10},        {"1.weight", 20},
                                                 {"1.bias", 30},    {"1.running_mean", 40}, {"1.running_var", 50}};
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = sign * (base.at(name) + static_cast<float>(i) / 8);
  return v;
}

// Saves the script's net to DIR/from_d2l.safetensors and runs tests/safetensors_torch.py on DIR (a
// fresh temporary folder, returned): it writes from_torch.safetensors, and with the safetensors
// package resaved.safetensors.
std::string exchange_with_torch() {
  std::string script = d2l::test::beside_source(__FILE__, "safetensors_torch.py");
  REQUIRE_MESSAGE(fs::exists(script), "no " << script);
  std::string dir = make_tmpdir();
  Net net(4, 3);
  net.initialize(Init::Uniform(), {cpu(0)});
  for (auto& [name, p] : net.collect_params())
    p->set_data(Tensor::from_vector(script_values(name, numel(p->shape()), 1), p->shape(), cpu(0)));
  save_parameters(net, dir + "/from_d2l.safetensors");
  // Float32 values of every class (all upper halves, lower halves at and around bfloat16's ties and
  // float16's) and their roundings by kernels/cpu/float16.hpp, for the script to compare with its own.
  std::vector<float> x;
  std::vector<uint16_t> bf16, f16;
  for (uint32_t hi = 0; hi < 0x10000; ++hi)
    for (uint32_t lo : {0x0000u, 0x1000u, 0x1001u, 0x7FFFu, 0x8000u, 0x8001u}) {
      x.push_back(std::bit_cast<float>(hi << 16 | lo));
      bf16.push_back(kernels::cpu::bf16_from_float(x.back()));
      f16.push_back(kernels::cpu::f16_from_float(x.back()));
    }
  SafetensorsFile halves;
  const Shape shape{static_cast<int64_t>(x.size())};
  halves.tensors = {{"x", FileTensor::from_floats(shape, x)},
                    {"x.bf16", FileTensor::from_bits16(FileDtype::bf16, shape, bf16)},
                    {"x.f16", FileTensor::from_bits16(FileDtype::f16, shape, f16)}};
  save_safetensors(dir + "/halves_from_d2l.safetensors", halves);
  std::fflush(nullptr);
  int rc = std::system(("'" + d2l::test::python() + "' '" + script + "' '" + dir + "'").c_str());
  REQUIRE(WIFEXITED(rc));
  REQUIRE(WEXITSTATUS(rc) == 0);
  return dir;
}

}  // namespace

// Skipped (reported as such) when the Python of d2l::test::python() cannot import torch.
TEST_CASE("files exchanged with PyTorch" * doctest::skip(!d2l::test::python_can_import("torch"))) {
  std::string dir = exchange_with_torch();
  // PyTorch's state_dict, num_batches_tracked included, loads into the same-shaped net.
  Net back(4, 0);
  back.initialize(Init::Uniform(), {cpu(0)});
  load_parameters(back, dir + "/from_torch.safetensors");
  for (auto& [name, p] : back.collect_params()) {
    CAPTURE(name);
    CHECK(same_bits(p->data(cpu(0)).to_vector(), script_values(name, numel(p->shape()), -1)));
  }
  CHECK(load_safetensors(dir + "/from_torch.safetensors").tensors.at("1.num_batches_tracked").ints() ==
        std::vector<int64_t>{7});
  // PyTorch's bfloat16 and float16 roundings are ours, bit for bit (NaNs as NaNs).
  SafetensorsFile halves = load_safetensors(dir + "/halves_from_torch.safetensors");
  const std::vector<float> y = halves.tensors.at("y").floats();
  const std::vector<uint16_t> bf16 = halves.tensors.at("y.bf16").bits16(), f16 = halves.tensors.at("y.f16").bits16();
  CHECK(halves.tensors.at("y.bf16").dtype == FileDtype::bf16);
  CHECK(halves.tensors.at("y.f16").dtype == FileDtype::f16);
  REQUIRE(y.size() == bf16.size());
  REQUIRE(y.size() == f16.size());
  int differ = 0;
  for (size_t i = 0; i < y.size(); ++i)
    differ += bf16[i] != kernels::cpu::bf16_from_float(y[i]) || f16[i] != kernels::cpu::f16_from_float(y[i]);
  CHECK(differ == 0);
  // PyTorch's model in bfloat16 loads into the float32 net, widened: the values of step 2 rounded.
  Net wide(4, 0);
  wide.initialize(Init::Uniform(), {cpu(0)});
  load_parameters(wide, dir + "/from_torch_bf16.safetensors");
  CHECK(load_safetensors(dir + "/from_torch_bf16.safetensors").tensors.at("0.weight").dtype == FileDtype::bf16);
  for (auto& [name, p] : wide.collect_params()) {
    CAPTURE(name);
    std::vector<float> want = script_values(name, numel(p->shape()), -1);
    for (float& v : want) v = kernels::cpu::float_from_bf16(kernels::cpu::bf16_from_float(v));
    CHECK(same_bits(p->data(cpu(0)).to_vector(), want));
  }
  fs::remove_all(dir);
}

// Skipped (reported as such) without the safetensors package (Debian 12 does not package it).
TEST_CASE("the safetensors package's writer gives our bytes" *
          doctest::skip(!d2l::test::python_can_import("torch, safetensors.torch"))) {
  std::string dir = exchange_with_torch();
  REQUIRE(fs::exists(dir + "/resaved.safetensors"));
  CHECK(read_file(dir + "/resaved.safetensors") == read_file(dir + "/from_d2l.safetensors"));
  fs::remove_all(dir);
}
