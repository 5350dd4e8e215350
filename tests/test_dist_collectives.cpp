// Collectives across processes (core/dist), run as 1, 2 and 3 processes (mpirun.sh) with closed-form
// data: rank r's device d holds r*10 + d + 1 (plus a pattern over the elements, so a misplaced chunk
// shows). Sizes 0, 1, 7, 1000003 and ones the rank count does not divide; the results are exact and
// every replica on every rank holds the same bits. Each rank uses two local devices, cpu(0) and emu(0),
// and before them gpu(local rank) when this host has a GPU for every process.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <future>
#include <thread>

#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;

namespace {

const std::vector<Device>& local_devices() {
  static const std::vector<Device> ds = [] {
    std::vector<Device> d{cpu(0), emu(0)};
    // With a GPU for every process on this host, the first device is gpu(local rank): the sum then
    // crosses the processes through NCCL (in a build with it).
    if (num_gpus() >= dist::world().local_size) d.insert(d.begin(), gpu(dist::world().local_rank));
    use_devices(d);
    return d;
  }();
  return ds;
}

// The last size crosses MPI's shared-memory transport as one large message (4 MB; 400 KB under
// ThreadSanitizer, whose instrumented element loops take ten times longer: large all the same).
#ifdef __SANITIZE_THREAD__
const int64_t kSizes[] = {0, 1, 2, 7, 1000, 100003};
#else
const int64_t kSizes[] = {0, 1, 2, 7, 1000, 1000003};
#endif

float pattern(int64_t i) { return static_cast<float>(i % 7); }

// Every rank's hash of the values, compared: true when all ranks hold the same bits.
bool same_on_every_rank(const std::vector<float>& v) {
  uint64_t h = 1469598103934665603ull;
  for (float x : v) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    h = (h ^ b) * 1099511628211ull;
  }
  auto all = dist::gather_strings(std::to_string(h));
  for (auto& s : all)
    if (s != all[0]) return false;
  return true;
}

}  // namespace

TEST_CASE("the world: ranks, sizes, local ranks agree with the launcher") {
  const auto& w = dist::world();
  CHECK(w.size >= 1);
  CHECK(w.rank < w.size);
  CHECK(w.local_rank < w.local_size);
  auto names = dist::gather_strings("rank " + std::to_string(w.rank));
  REQUIRE(static_cast<int>(names.size()) == w.size);
  for (int r = 0; r < w.size; ++r) CHECK(names[static_cast<size_t>(r)] == "rank " + std::to_string(r));
  dist::barrier();
}

TEST_CASE("hierarchical allreduce (library, ring, naive): the exact sum on every device of every rank") {
  const int W = dist::world_size(), r = dist::rank();
  const auto& ds = local_devices();
  const int k = static_cast<int>(ds.size());
  for (const char* algo : {"library", "ring", "naive"})
    for (const char* local : {"naive", "ring"})
      for (int64_t n : kSizes) {
        CAPTURE(algo);
        CAPTURE(local);
        CAPTURE(n);
        std::vector<Tensor> data;
        for (int d = 0; d < k; ++d) {
          std::vector<float> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(r * 10 + d + 1) + pattern(i);
          data.push_back(Tensor::from_vector(v, {n}, ds[static_cast<size_t>(d)]));
        }
        dist::allreduce(data, local, algo);
        double base = 0;  // sum over ranks and devices of r*10 + d + 1
        for (int q = 0; q < W; ++q)
          for (int d = 0; d < k; ++d) base += q * 10 + d + 1;
        std::vector<float> want(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = static_cast<float>(base + W * k * pattern(i));
        for (auto& t : data) CHECK(t.to_vector() == want);
      }
}

TEST_CASE("allreduce of inexact values: the same bits on every rank and device, close to the double sum") {
  const int W = dist::world_size(), r = dist::rank();
  const int64_t n = 100003;
  for (const char* algo : {"library", "ring", "naive"}) {
    CAPTURE(algo);
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = 0.1f * static_cast<float>(r + 1) / static_cast<float>(1 + i % 13);
    Tensor t = Tensor::from_vector(v, {n}, cpu(0));
    dist::allreduce(t, algo);
    auto got = t.to_vector();
    CHECK(same_on_every_rank(got));
    double worst = 0;
    for (int64_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q = 0; q < W; ++q) want += static_cast<double>(0.1f * static_cast<float>(q + 1) / static_cast<float>(1 + i % 13));
      worst = std::max(worst, std::abs(got[static_cast<size_t>(i)] - want) / want);
    }
    CHECK(worst < 1e-6);
  }
}

// DDP's compression hooks sum 16-bit tensors (core/dist/buckets.hpp). Positive values, so the bound
// is (W - 1) roundings of the 16-bit format, relative; over 2 ranks there is one addition, whose
// rounding the format's reference conversion (kernels/cpu/float16.hpp) gives exactly.
TEST_CASE("allreduce in bfloat16 and float16: each addition rounded to the format, the same bits everywhere, 2 bytes an element") {
  const int W = dist::world_size(), r = dist::rank();
  const int64_t n = 1003;
  auto value = [](int q, int64_t i) { return 0.37f * static_cast<float>(q + 1) + static_cast<float>(i % 11) / 3.0f; };
  for (DType type : {DType::bf16, DType::f16})
    for (Device d : {cpu(0), emu(0)})
      for (const char* algo : {"library", "ring", "naive"}) {
        CAPTURE(dtype_name(type));
        CAPTURE(d);
        CAPTURE(algo);
        const double u = type == DType::bf16 ? 1.0 / 256 : 1.0 / 2048;  // unit roundoff: 2^-8, 2^-11
        auto rounded = [&](float x) { return cast(Tensor::from_vector(std::vector<float>{x}, {1}, cpu(0)), type).to_vector()[0]; };
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(r, i);
        Tensor t = cast(Tensor::from_vector(v, {n}, d), type);
        dist::reset_collective_counters();
        dist::allreduce(t, algo);
        auto got = t.to_vector();
        CHECK(t.dtype() == type);
        CHECK(same_on_every_rank(got));
        if (W > 1) CHECK(dist::collective_counters().allreduce.input_bytes == 2 * n);
        // The values repeat with period 11; over 3 ranks the ring's chunks add in different orders.
        double want[11], once[11];
        for (int64_t i = 0; i < 11; ++i) {
          want[i] = 0;
          for (int q = 0; q < W; ++q) want[i] += rounded(value(q, i));  // exact in double
          once[i] = rounded(static_cast<float>(want[i]));                 // the one rounding of 2 ranks
        }
        double worst = 0;
        int64_t exact = 0;
        for (int64_t i = 0; i < n; ++i) {
          const double g = got[static_cast<size_t>(i)];
          worst = std::max(worst, std::abs(g - want[i % 11]) / want[i % 11]);
          exact += g == once[i % 11];
        }
        CHECK(worst <= (W - 1) * u);
        if (W == 2) CHECK(exact == n);
      }
}

TEST_CASE("broadcast: every rank's tensor becomes the root's, on cpu and emu devices") {
  const int W = dist::world_size(), r = dist::rank();
  for (Device d : local_devices())
    for (int root : {0, W - 1})
      for (int64_t n : kSizes) {
        CAPTURE(root);
        CAPTURE(n);
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(r * 10 + 1) + pattern(i);
        Tensor t = Tensor::from_vector(v, {n}, d);
        dist::broadcast(t, root);
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(root * 10 + 1) + pattern(i);
        CHECK(t.to_vector() == v);
      }
  CHECK_THROWS_AS(dist::broadcast(Tensor::zeros({3}, cpu(0)), W), ConfigError);
}

TEST_CASE("allgather and reduce_scatter: chunks of sizes differing by one, any size") {
  const int W = dist::world_size(), r = dist::rank();
  for (Device d : local_devices())
    for (int64_t n : kSizes) {
      CAPTURE(n);
      const int64_t b = dist::chunk_begin(n, r), e = dist::chunk_begin(n, r + 1);
      CHECK(dist::chunk_begin(n, 0) == 0);
      CHECK(dist::chunk_begin(n, W) == n);
      CHECK(e - b <= n / W + 1);
      // allgather: rank r contributes its chunk of 0, 1, ..., n-1 (times r + 1, to see who sent it)
      std::vector<float> mine;
      for (int64_t i = b; i < e; ++i) mine.push_back(static_cast<float>(i));
      Tensor out = Tensor::zeros({n}, d);
      dist::allgather(Tensor::from_vector(mine, {e - b}, d), out);
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[static_cast<size_t>(i)] = static_cast<float>(i);
      CHECK(out.to_vector() == want);
      // reduce_scatter: rank q holds (q + 1) * (i % 100); rank r gets the sum of its chunk
      std::vector<float> all(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) all[static_cast<size_t>(i)] = static_cast<float>((r + 1) * (i % 100));
      Tensor part = Tensor::zeros({e - b}, d);
      dist::reduce_scatter(Tensor::from_vector(all, {n}, d), part);
      std::vector<float> sum;
      for (int64_t i = b; i < e; ++i) sum.push_back(static_cast<float>(W * (W + 1) / 2 * (i % 100)));
      CHECK(part.to_vector() == sum);
    }
  CHECK_THROWS_AS(dist::allgather(Tensor::zeros({999}, cpu(0)), Tensor::zeros({1000}, cpu(0))), std::invalid_argument);
}

TEST_CASE("collectives are stream work: the host only enqueues, the result follows the producer") {
  // The device's compute stream is held by a task that waits for a gate this thread opens. With the
  // gate closed, the adds, the allreduce and the add after it must all return to the host (they are
  // queued, not run); opened, the result is the sum of what each rank's queue produced.
  const int W = dist::world_size();
  Tensor t = Tensor::zeros({4096}, cpu(0));
  Tensor one = Tensor::ones({4096}, cpu(0));
  waitall();
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  runtime(cpu(0)).compute.enqueue("test gate", [opened] { opened.wait(); });
  std::atomic<int> returned{0};
  std::thread host([&] {
    for (int i = 0; i < 200; ++i) add_(t, one);
    dist::allreduce(t, "ring");
    add_(t, one);  // after the allreduce, on the device's stream
    returned = 1;
  });
  // The host thread returns with nothing run (waited for at most 20 s, then the gate opens anyway).
  for (int i = 0; i < 2000 && returned.load() == 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const bool enqueued_only = returned.load() == 1;
  gate.set_value();
  host.join();
  CHECK(enqueued_only);
  CHECK(t.to_vector() == std::vector<float>(4096, static_cast<float>(200 * W + 1)));
}

TEST_CASE("sum_over_ranks and the configuration fingerprint") {
  const int W = dist::world_size(), r = dist::rank();
  auto s = dist::sum_over_ranks({1.0, static_cast<double>(r)});
  CHECK(s[0] == W);
  CHECK(s[1] == W * (W - 1) / 2);
  dist::Fingerprint same{{"model", "lenet"}, {"batch_size", "256"}};
  CHECK_NOTHROW(dist::check_same_config(same));
  if (W > 1) {
    dist::Fingerprint differs = same;
    if (r == W - 1) differs[1].second = "64";
    CHECK_THROWS_WITH_AS(dist::check_same_config(differs),
                         ("the ranks' configurations differ: rank " + std::to_string(W - 1) +
                          " has batch_size 64, rank 0 has 256").c_str(),
                         dist::CollectiveError);
    dist::Fingerprint shorter = same;
    if (r == 1) shorter.pop_back();
    CHECK_THROWS_AS(dist::check_same_config(shorter), dist::CollectiveError);
    Tensor t = Tensor::full({5}, r == 1 ? 2.0f : 1.0f, cpu(0));
    CHECK_THROWS_AS(dist::check_same_bits({t}, "parameters"), dist::CollectiveError);
    dist::broadcast(t, 0);
    CHECK_NOTHROW(dist::check_same_bits({t}, "parameters"));
  }
}
