// Several emulated GPUs side by side (docs/devices-and-streams.md): copies between emu(i)
// and the host keep every byte, copies order work across them (event waits: test_stream), the thread budget and
// the errors behave as on cpu(i), allreduce over three of them gives the host's sum, and conv2d's
// GEMMs follow --gemm (detail::set_gemm).
// Timing only bounds a wait (a deadline), never asserts speed.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "check.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/ops/op.hpp"  // detail::set_gemm
#include "core/runtime.hpp"
#include "kernels/emu/launch.hpp"
#include "tests/first_devices.hpp"

using namespace d2l;
using namespace std::chrono_literals;

namespace {
std::vector<Device> emus(int n) { return test::first_devices(n, DeviceKind::emu); }

std::vector<unsigned char> bytes_of(const std::vector<float>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(float));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

void empty_kernel(int) {}
}  // namespace

TEST_CASE("values pass cpu(0) -> emu(0) -> emu(1) -> emu(2) -> cpu(0) unchanged, counted on each device") {
  emus(3);
  for (int64_t n : {1, 7, 1001}) {
    CAPTURE(n);
    reset_copy_counters();
    auto v = test::lcg_data(n, static_cast<uint32_t>(n));
    Tensor on1 = Tensor::from_vector(v, {n}, cpu(0)).to(emu(0)).to(emu(1));
    Tensor on2 = on1.to(emu(2));
    CHECK(on1.device() == emu(1));
    CHECK(on2.device() == emu(2));
    CHECK(bytes_of(on2.to(cpu(0)).to_vector()) == bytes_of(v));
    for (int i : {0, 1, 2}) CHECK(copy_counters(emu(i)).bytes_in == n * 4);
    CHECK(copy_counters(cpu(0)).bytes_in == n * 4);
  }
  // Labels (int32) too, straight from the host to each device and back.
  std::vector<int32_t> labels{-7, 0, 3, 2147483647, -2147483647 - 1};
  for (int i : {0, 1, 2})
    CHECK(Tensor::from_vector(labels, {5}, cpu(0)).to(emu(i)).to(cpu(0)).to_labels() == labels);
}

TEST_CASE("copy_bytes at odd byte offsets between emulated GPUs and the host, in program order") {
  emus(2);
  // Three 256-byte tensors and their host models; every copy is done on both.
  std::vector<Device> on{emu(0), emu(1), cpu(0)};
  std::vector<std::vector<unsigned char>> model;
  std::vector<Tensor> t;
  for (int i = 0; i < 3; ++i) {
    auto v = test::lcg_data(64, static_cast<uint32_t>(i + 1));
    model.push_back(bytes_of(v));
    t.push_back(Tensor::from_vector(v, {64}, on[i]));
  }
  // {from, offset, to, offset, bytes}: each reads what an earlier one wrote or writes what it read.
  const size_t steps[][5] = {{0, 3, 1, 9, 101},    // emu(0) -> emu(1)
                             {1, 5, 2, 250, 6},    // emu(1) -> cpu(0)
                             {2, 131, 0, 0, 125},  // cpu(0) -> emu(0), over bytes read by the first
                             {0, 1, 1, 255, 1},    // the last byte of emu(1)
                             {1, 17, 0, 77, 33}};  // emu(1) -> emu(0)
  for (auto& s : steps) {
    copy_bytes(t[s[0]], s[1], t[s[2]], s[3], s[4]);
    std::memcpy(model[s[2]].data() + s[3], model[s[0]].data() + s[1], s[4]);
  }
  for (int i = 0; i < 3; ++i) CHECK(bytes_of(t[i].to_vector()) == model[i]);
  CHECK_THROWS_AS(copy_bytes(t[0], 200, t[1], 0, 57), ShapeError);
  CHECK_THROWS_AS(copy_bytes(t[2], 0, t[1], 1, 256), ShapeError);
}

TEST_CASE("emu(0), emu(1) and emu(2) meet at a rendezvous: the emulated GPUs run at the same time") {
  emus(3);
  std::atomic<int> arrived{0}, met{0};
  for (int i = 0; i < 3; ++i)
    launch(emu(i), "rendezvous", {}, [&](const LaunchCtx&) {
      arrived.fetch_add(1);
      auto deadline = std::chrono::steady_clock::now() + 10s;
      while (arrived.load() < 3 && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(1ms);
      if (arrived.load() == 3) met.fetch_add(1);
    });
  waitall();
  CHECK(met.load() == 3);
}

TEST_CASE("a copy between emulated GPUs comes after its producer and before its consumer") {
  emus(3);
  for (int round = 0; round < 10; ++round) {
    Tensor a = Tensor::full({1001}, static_cast<float>(round), emu(0));
    Tensor b = add(a, a).to(emu(1)).to(emu(2));  // produced on emu(0), copied twice
    Tensor c = add(b, b);                         // consumed on emu(2)
    fill_(a, -1.0f);                              // must not race the copy of add(a, a)
    auto v = c.to_vector();
    CHECK(v.front() == 4.0f * round);
    CHECK(v.back() == 4.0f * round);
  }
  // Held back, so that an unordered copy would have all the time it needs to go wrong.
  std::promise<void> producer_gate, consumer_gate;
  std::shared_future<void> produce = producer_gate.get_future().share(), consume = consumer_gate.get_future().share();
  Tensor a = Tensor::zeros({1001}, emu(0));
  float* pa = a.data();
  launch(emu(0), "held-back producer", {a.storage()}, [=](const LaunchCtx&) {
    produce.wait();
    for (int i = 0; i < 1001; ++i) pa[i] = static_cast<float>(i);
  });
  Tensor b = a.to(emu(1));  // must wait for the producer
  Tensor c = add(b, b);     // must wait for the copy
  launch(emu(2), "held-back reader", {}, [=](const LaunchCtx&) { consume.wait(); });
  Tensor d = b.to(emu(2));  // waits behind the reader on emu(2) ...
  fill_(b, -1.0f);          // ... so this write on emu(1) must wait for that copy to read b
  std::this_thread::sleep_for(50ms);
  producer_gate.set_value();
  std::this_thread::sleep_for(50ms);
  consumer_gate.set_value();
  auto vc = c.to_vector(), vd = d.to_vector();
  for (int i : {0, 1, 500, 1000}) {
    CAPTURE(i);
    CHECK(vc[i] == 2.0f * i);
    CHECK(vd[i] == static_cast<float>(i));
  }
  CHECK(b.to_vector()[7] == -1.0f);
}

TEST_CASE("thread budget: cores shared among the cpu and emu devices in use") {
  int cores = num_cores();
  CHECK(use_devices({emu(0)}) == cores);
  CHECK(runtime(emu(0)).threads() == cores);
  int each = use_devices({cpu(0), emu(0), emu(1)});
  CHECK(each == std::max(1, cores / 3));
  for (Device d : {cpu(0), emu(0), emu(1)}) CHECK(runtime(d).threads() == each);
  // A kernel sees its device's budget, and whether it runs emulated.
  std::atomic<int> threads0{0}, threads1{0};
  std::atomic<bool> emulated0{false}, emulated1{true};
  launch(emu(1), "budget", {}, [&](const LaunchCtx& c) {
    threads0 = c.cpu.threads;
    emulated0 = c.backend == Backend::emu;
  });
  launch(cpu(0), "budget", {}, [&](const LaunchCtx& c) {
    threads1 = c.cpu.threads;
    emulated1 = c.backend == Backend::emu;
  });
  waitall();
  CHECK(threads0.load() == each);
  CHECK(threads1.load() == each);
  CHECK(emulated0.load());
  CHECK_FALSE(emulated1.load());
}

TEST_CASE("an error inside an emu stream surfaces at the next sync, naming the op and the device") {
  emus(3);
  launch(emu(1), "exploding_kernel", {}, [](const LaunchCtx&) { throw std::runtime_error("bad value"); });
  CHECK_THROWS_WITH_AS(waitall(), "exploding_kernel on emu(1): bad value", DeviceError);
  waitall();  // reported once; the device keeps working
  CHECK(Tensor::full({3}, 2.0f, emu(1)).to_vector() == std::vector<float>{2, 2, 2});
  // An emulated CUDA launch that CUDA would refuse (1025 threads a block).
  launch(emu(2), "too_wide", {}, [](const LaunchCtx& c) {
    cuda_emu::make_launch("empty_kernel", empty_kernel, 1, 1025, 0, &c.cpu)(0);
  });
  CHECK_THROWS_WITH_AS(runtime(emu(2)).compute.synchronize(),
                       doctest::Contains("too_wide on emu(2): invalid launch of kernel empty_kernel"), DeviceError);
  // Through an op: a label out of range is found on the device.
  Tensor logits = Tensor::zeros({2, 3}, emu(0));
  Tensor labels = Tensor::from_vector(std::vector<int32_t>{0, 7}, {2}, emu(0));
  Tensor l = softmax_cross_entropy(logits, labels);
  CHECK_THROWS_WITH_AS(l.item(), doctest::Contains("softmax_cross_entropy on emu(0): label 7"), DeviceError);
}

TEST_CASE("naive and ring allreduce over three emulated GPUs give the host's sum on every device") {
  for (auto ds : {std::vector<Device>{emu(0), emu(1), emu(2)}, std::vector<Device>{emu(0), cpu(1), emu(2)}})
    for (const char* algo : {"naive", "ring"})
      for (int64_t len : {2, 1001}) {  // 2 < 3 devices: a ring chunk is empty
        CAPTURE(str(ds));
        CAPTURE(algo);
        CAPTURE(len);
        use_devices(ds);
        std::vector<Tensor> data;
        std::vector<float> want(len, 0.0f);
        for (size_t i = 0; i < ds.size(); ++i) {
          auto v = test::lcg_data(len, static_cast<uint32_t>(10 + i));
          for (auto& x : v) x = std::round(x * 256) / 32;  // multiples of 1/32: every sum is exact
          for (int64_t k = 0; k < len; ++k) want[k] += v[k];
          data.push_back(Tensor::from_vector(v, {len}, ds[i]));
        }
        allreduce(data, algo);
        for (auto& t : data) CHECK(t.to_vector() == want);
      }
}

TEST_CASE("conv2d on emu(0) follows --gemm: the CPU GEMM for cublas, the emulated kernel for tiled") {
  emus(1);
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::im2col);  // the member with one im2col launch
  const auto xv = test::lcg_data(2 * 3 * 6 * 6, 11), wv = test::lcg_data(4 * 3 * 3 * 3, 12);
  const auto bv = test::lcg_data(4, 13);
  const Tensor x = Tensor::from_vector(xv, {2, 3, 6, 6}, emu(0)), w = Tensor::from_vector(wv, {4, 3, 3, 3}, emu(0));
  const Tensor b = Tensor::from_vector(bv, {4}, emu(0));
  const Tensor host = conv2d(x.to(cpu(0)), w.to(cpu(0)), b.to(cpu(0)), {1, 1}, {1, 1});
  for (const char* gemm : {"cublas", "tiled", "regblock", "warptiled", "tf32", "naive"}) {
    CAPTURE(gemm);
    detail::set_gemm(gemm);
    cuda_emu::clear_launch_log();
    const std::vector<float> y = conv2d(x, w, b, {1, 1}, {1, 1}).to(cpu(0)).to_vector();
    const auto log = cuda_emu::launch_log();
    const bool hand_written = std::string(gemm) != "cublas";
    CHECK((log.count("matmul_kernel2_tiled") + log.count("matmul_kernel3_regblock") +
           log.count("matmul_kernel4_warptiled") + log.count("matmul_kernel5_tf32") + log.count("matmul_kernel1_naive")) ==
          (hand_written ? 1u : 0u));
    CHECK(log.count("im2col_kernel") == 1);
    const std::vector<float> want = host.to_vector();
    REQUIRE(y.size() == want.size());
    double err = 0;
    for (size_t i = 0; i < y.size(); ++i) err = std::max(err, double(std::fabs(y[i] - want[i])));
    // tf32 rounds its inputs to TF32 (2^-11 relative): sums of 27 products of values below 1, off by
    // ~1e-3 where FP32's are by ~1e-6.
    CAPTURE(err);
    CHECK(err <= (std::string(gemm) == "tf32" ? 1e-2 : 1e-4));
  }
  detail::set_gemm("cublas");
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::automatic);  // the default
}

TEST_CASE("conv2d on emu(0) in TF32: --gemm mma runs kernel5 on its mma core, every other name on its wmma core") {
  emus(1);
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::implicit);
  kernels::cpu::set_precision(kernels::cpu::Precision::tf32);
  const Tensor x = Tensor::from_vector(test::lcg_data(2 * 3 * 6 * 6, 14), {2, 3, 6, 6}, emu(0));
  const Tensor w = Tensor::from_vector(test::lcg_data(4 * 3 * 3 * 3, 15), {4, 3, 3, 3}, emu(0));
  const Tensor b = Tensor::from_vector(test::lcg_data(4, 16), {4}, emu(0));
  const std::vector<float> want = conv2d(x.to(cpu(0)), w.to(cpu(0)), b.to(cpu(0)), {1, 1}, {1, 1}).to_vector();
  for (const char* gemm : {"mma", "tf32", "cublas"}) {
    CAPTURE(gemm);
    detail::set_gemm(gemm);
    cuda_emu::clear_launch_log();
    const std::vector<float> y = conv2d(x, w, b, {1, 1}, {1, 1}).to(cpu(0)).to_vector();
    auto launched = [](const std::string& kernel) {  // a template kernel is logged with its arguments
      int64_t n = 0;
      for (const auto& [name, count] : cuda_emu::launch_log())
        if (name.rfind(kernel + "<", 0) == 0) n += count;
      return n;
    };
    const bool mma = std::string(gemm) == "mma";
    CHECK(launched("conv2d_implicit_mma_kernel") == (mma ? 1 : 0));
    CHECK(launched("conv2d_implicit_tf32_kernel") == (mma ? 0 : 1));
    REQUIRE(y.size() == want.size());
    double err = 0;
    for (size_t i = 0; i < y.size(); ++i) err = std::max(err, double(std::fabs(y[i] - want[i])));
    CAPTURE(err);
    CHECK(err <= 1e-2);  // TF32's inputs: sums of 27 products of values below 1
  }
  detail::set_gemm("cublas");
  kernels::cpu::set_precision(kernels::cpu::Precision::automatic);
  kernels::cpu::set_conv2d_kernel(kernels::cpu::Conv2dKernel::automatic);  // the default
}
