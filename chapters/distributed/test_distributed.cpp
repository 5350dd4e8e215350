// Chapter 4's parts as functions, run as 1, 2 and 3 processes (tests/dist/mpirun.sh). The pure
// pieces (the hidden fraction, the latency-bound reading) against hand-made inputs; the parts with
// --quick sizes: the benchmark's rows, the DDP variants' buckets and timings, the equivalence, the
// key-value store, and one timeline holding every rank.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "chapters/distributed/distributed.hpp"
#include "chapters/harness/harness.hpp"
#include "chapters/distributed/kv.hpp"
#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;
namespace dd = d2l::distributed;

namespace {

trace::Record rec(const char* stream, const char* label, double a, double b) {
  trace::Record r;
  r.device = cpu(0);
  r.stream = stream;
  r.name = "op";
  r.label = label;
  r.start_us = a;
  r.end_us = b;
  return r;
}

dd::Config quick() {
  dd::Config c;
  dd::make_quick(c);
  c.devices = {cpu(0)};
  use_devices(c.devices);
  c.out_dir = "";
  c.verbose = false;
  return c;
}

}  // namespace

TEST_CASE("hidden fraction: communication time during which the device computes, from trace records") {
  // comm [0, 10) and [20, 30) (20 us); backward compute [5, 25) and [8, 12) (overlapping each
  // other): hidden [5, 10) and [20, 25) = 10 us of 20. Forward, a copy and a packing task do not count.
  std::vector<trace::Record> ev{rec("comm", "bucket 0 (1 MB)", 0, 10), rec("comm", "bucket 1 (1 MB)", 20, 30),
                                rec("compute", "backward", 5, 25), rec("compute", "backward", 8, 12),
                                rec("copy", "backward", 0, 30), rec("compute", "forward", 0, 5), rec("compute", "bucket 1 (1 MB)", 0, 30),
                                rec("comm", "not a bucket", 40, 50)};
  auto [hidden, seconds] = dd::hidden_fraction(ev, cpu(0));
  CHECK(hidden == doctest::Approx(0.5));
  CHECK(seconds == doctest::Approx(20e-6));
  CHECK(dd::hidden_fraction(ev, cpu(1)).first == 0);  // another device computed nothing
  CHECK(dd::hidden_fraction({}, cpu(0)).second == 0);
}

TEST_CASE("the benchmark's reading: latency-bound below the size where busbw reaches half its peak") {
  std::vector<dd::BandwidthRow> rows;
  for (auto [bytes, bw] : std::vector<std::pair<double, double>>{{1e3, 0.1}, {1e4, 0.8}, {1e5, 2.0}, {1e6, 3.9}, {1e7, 4.0}})
    rows.push_back({bytes, "ring", 0, 0, bw});
  rows.push_back({1e3, "naive", 0, 0, 5.0});
  CHECK(dd::latency_bound_below(rows, "ring") == 1e5);
  CHECK(dd::latency_bound_below(rows, "naive") == 1e3);
  CHECK(dd::latency_bound_below(rows, "library") == 0);
}

TEST_CASE("the key-value store: init takes rank 0's value, push sums every device of every rank, pull copies") {
  dd::KVStore kv;
  std::vector<Device> devs{cpu(0), cpu(1)};
  use_devices(devs);
  kv.init(7, Tensor::full({3}, static_cast<float>(1 + dist::rank()), cpu(0)));
  Tensor a = Tensor::zeros({3}, cpu(1));
  kv.pull(7, {a});
  CHECK(a.to_vector() == std::vector<float>(3, 1.0f));  // rank 0's
  kv.push(7, {Tensor::full({3}, 2.0f, cpu(0)), Tensor::full({3}, 3.0f, cpu(1))});
  kv.pull(7, {a});
  CHECK(a.to_vector() == std::vector<float>(3, 5.0f * static_cast<float>(dist::world_size())));
  CHECK_THROWS_AS(kv.init(7, a), ConfigError);
  CHECK_THROWS_AS(kv.pull(8, {a}), ConfigError);
  CHECK_THROWS_AS(kv.push(7, {Tensor::zeros({4}, cpu(0))}), ShapeError);
  CHECK_THROWS_AS(kv.pull(7, {Tensor::zeros({2}, cpu(0))}), ShapeError);
}

// Skipped (reported as such) in a world of one: the parts need mpirun.
TEST_CASE("the parts at --quick sizes: benchmark rows, DDP variants, equivalence, one timeline of every rank" *
          doctest::skip(dist::world_size() == 1)) {
  dd::Config cfg = quick();
  auto rows = dd::bandwidth(cfg);
  REQUIRE(rows.size() == 3 * cfg.sizes.size());

  std::vector<trace::Record> events;
  auto v = dd::ddp(cfg, true, &events);
  REQUIRE(v.size() == 3 + cfg.bucket_mbs.size());  // and the 25 MB buckets under bf16_compress, last
  size_t trainable = 0;
  for (auto& [name, p] : concise::resnet18(10)->collect_params()) trainable += p->differentiable() ? 1 : 0;
  CHECK(v[0].buckets == trainable);  // ResNet-18's trainable parameters, one bucket each
  CHECK(v[1].buckets == 1);   // one flat allreduce
  CHECK(v.back().buckets >= 1);
  CHECK(v.back().buckets < v[0].buckets);
  // What the traced steps handed the allreduce, counted: float32's 4 bytes a gradient in every
  // layout, bf16_compress's 2.
  CHECK(v.back().comm_type == DType::bf16);
  CHECK(v[0].allreduce_bytes > 0);
  for (size_t i = 0; i + 1 < v.size(); ++i) CHECK(v[i].allreduce_bytes == v[0].allreduce_bytes);
  CHECK(v[0].allreduce_bytes == 2 * v.back().allreduce_bytes);
  for (auto& x : v) {
    CHECK(x.step_seconds.size() == static_cast<size_t>(cfg.repeats));
    double total = 0;
    for (double s : x.step_seconds) total += s;
    CHECK(x.mean == doctest::Approx(total / static_cast<double>(x.step_seconds.size())));
    CHECK(x.std <= *std::max_element(x.step_seconds.begin(), x.step_seconds.end()) -
                       *std::min_element(x.step_seconds.begin(), x.step_seconds.end()));
  }
  CHECK_FALSE(events.empty());

  auto [diff, scale] = dd::equivalence(cfg);
  CHECK(diff <= 1e-5 * scale);

  const auto path = std::filesystem::temp_directory_path() / "d2l_distributed_timeline.json";
  d2l::harness::write_timeline(path.string(), events);
  dist::barrier();
  if (dist::rank() == 0) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    for (int r = 0; r < dist::world_size(); ++r) {
      CAPTURE(r);
      CHECK(text.str().find("\"name\": \"rank " + std::to_string(r) + "\"") != std::string::npos);
      CHECK(text.str().find("\"pid\": " + std::to_string(r) + ", \"tid\"") != std::string::npos);
    }
    CHECK(text.str().find("\"name\": \"bucket 0") != std::string::npos);
    CHECK(text.str().find("cpu(0) comm") != std::string::npos);
    std::filesystem::remove(path);
  }
}

TEST_CASE("--precision bf16 and fp16: the equivalence under autocast, and fp16's DDP steps with every bucket layout" *
          doctest::skip(dist::world_size() == 1)) {
  for (DType t : {DType::bf16, DType::f16}) {
    CAPTURE(dtype_name(t));
    dd::Config cfg = quick();
    cfg.autocast = t;
    if (t == DType::f16) {  // float16's loop is bfloat16's with the GradScaler added
      cfg.bucket_mbs = {25};
      auto v = dd::ddp(cfg, false, nullptr);
      REQUIRE(v.size() == 4);  // after backward: per parameter, flat; 25 MB buckets; and them under bf16_compress
      for (auto& x : v) CHECK(x.step_seconds.size() == static_cast<size_t>(cfg.repeats));
    }
    // W processes equal one process with W devices under autocast too (fp16: the same steps skipped)
    auto [diff, scale] = dd::equivalence(cfg);
    CHECK(scale > 0);
    CHECK(diff <= 1e-5 * scale);
  }
}

// A wall-clock reading (suite timing, as distributed_link_np2, the plain run only, retried): busbw
// over a modelled link, against the link's bandwidth and the test's own clock.
TEST_CASE("busbw over a modelled link: the ring and the library reach the link, naive 1/W of it" *
          doctest::skip(dist::world_size() == 1)) {
  // busbw against a link whose bandwidth the test sets: over a modelled link of 8 Gbit/s (1 GB/s a
  // link, no latency) every allreduce lasts at least what its messages take on that link, so the
  // ring's and the library's busbw (what each link carries) can reach 1 GB/s and not exceed it, and
  // the naive algorithm's, whose W-1 whole tensors in and out all pass rank 0's link, 1/W of it.
  // The time of 8 of them, taken with the test's own clock, must give the benchmark's figure.
  const int W = dist::world_size();
  dd::Config linked = quick();
  linked.sizes = {1e6};
  linked.seconds_per_point = 0.02;
  dist::set_link_model({8.0, 0.0});
  auto on_link = dd::bandwidth(linked);
  Tensor t = Tensor::full({250000}, 1.0f, cpu(0));
  waitall();
  dist::barrier();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 8; ++i) dist::allreduce(t, "ring");
  waitall();
  const double own = dd::max_over_ranks(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / 8);
  dist::set_link_model({});
  REQUIRE(on_link.size() == 3);
  for (auto& r : on_link) {
    CAPTURE(r.algorithm);
    CHECK(r.bytes == 1e6);
    const double link = r.algorithm == "naive" ? 1.0 / W : 1.0;  // GB/s
    CHECK(r.busbw <= 1.02 * link);
    CHECK(r.busbw >= 0.3 * link);
  }
  // The ring at 1 MB on the link: 2(W-1) messages of 1/W MB at 1 GB/s each, by the test's clock.
  CHECK(own >= 2.0 * (W - 1) / W * 1e-3);
  CHECK(on_link[1].seconds == doctest::Approx(own).epsilon(0.5));
}
