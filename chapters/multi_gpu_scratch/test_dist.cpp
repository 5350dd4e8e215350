// Chapter 1 with --dist, run as 1, 2 and 3 processes (tests/dist/mpirun.sh). P processes x k devices
// (D2L_TEST_LOCAL_DEVICES, default 1) train what 1 process x P*k devices and 1 device train (LeNet
// has no BatchNorm): the same parameters within 1e-5 relative after 20 steps, with the same bits on
// every rank after every checked step; each example of an epoch is read by exactly one rank.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <set>
#include <sstream>

#include "chapters/multi_gpu_scratch/multi_gpu_scratch.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"
#include "tests/dist/dist_check.hpp"
#include "tests/first_devices.hpp"
#include "tests/small_run.hpp"

using namespace d2l;

namespace {

int local_devices() {
  const char* v = std::getenv("D2L_TEST_LOCAL_DEVICES");
  return v ? std::atoi(v) : 1;
}

std::vector<Device> cpus(int n) { return test::first_devices(n); }

// One epoch of `steps` minibatches of 48: on 1, 2, 3, 4 and 6 devices shards of 48 / k, uneven ones on 5.
scratch::Config small(int devices, int64_t steps) {
  scratch::Config c = test::small_run<scratch::Config>(cpus(devices), {.train_images = 48 * steps, .test_images = 200,
                                                                       .image_size = 28, .data_seed = 7,
                                                                       .batch_size = 48, .lr = 0.3f, .seed = 4});
  c.plot = "";
  return c;
}

}  // namespace

TEST_CASE("shards: each example of an epoch goes to exactly one rank, every rank has as many minibatches") {
  const int W = dist::world_size(), r = dist::rank(), k = 2;
  ArrayDataset d;
  d.n = 103;  // not divisible by the 48 / 10 / ranks: a short last minibatch
  d.feature_shape = {1};
  for (int64_t i = 0; i < d.n; ++i) d.features.push_back(static_cast<float>(i)), d.labels.push_back(static_cast<int32_t>(i));
  DataIter it(d, 10, true, 5);
  it.shard(W * k, r * k, (r + 1) * k);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::ostringstream mine;
    int64_t batches = 0;
    for (const Batch& b : it.epoch(epoch)) {
      ++batches;
      CHECK(b.global_n == std::min<int64_t>(10, d.n - (batches - 1) * 10));
      for (int64_t i = 0; i < b.n; ++i) {
        CHECK(b.X[static_cast<size_t>(i)] == static_cast<float>(b.y[static_cast<size_t>(i)]));
        mine << b.y[static_cast<size_t>(i)] << " ";
      }
    }
    CHECK(batches == it.num_batches());
    std::multiset<int> seen;
    for (auto& s : dist::gather_strings(mine.str())) {
      std::istringstream in(s);
      for (int x; in >> x;) seen.insert(x);
    }
    CHECK(seen.size() == static_cast<size_t>(d.n));
    for (int i = 0; i < d.n; ++i) CHECK(seen.count(i) == 1);
  }
}

TEST_CASE("--dist: P processes x k devices == 1 process x P*k devices == 1 device, bitwise equal ranks") {
  const int W = dist::world_size(), k = local_devices();
  CAPTURE(W);
  CAPTURE(k);
  // Every rank also trains the two references alone (no collectives), on its own devices.
  // P*k devices in one process sum the same shards' gradients in the same order as P processes: equal
  // within float rounding after 20 steps. One device computes the whole batch's gradient in one
  // GEMM (another summation order): compared after 2 steps, before training at lr 0.3 magnifies
  // the last-bit differences (after 20 steps they reach 1e-3 with OpenBLAS's AVX-512 kernels).
  scratch::Config ref = small(W * k, 20);
  auto many = scratch::train(ref).params[0];
  auto one = scratch::train(small(1, 2)).params[0];
  CHECK(test::relative_difference(scratch::train(small(W * k, 2)).params[0], one) < 1e-5);
  for (const char* algo : {"library", "ring"})
    for (int64_t steps : {1, 2, 20}) {
      CAPTURE(algo);
      CAPTURE(steps);
      scratch::Config c = small(k, steps);
      c.dist = true;
      c.dist_allreduce = algo;
      scratch::Result r = scratch::train(c);
      for (size_t d = 1; d < r.params.size(); ++d) CHECK(r.params[d] == r.params[0]);  // the process's replicas
      CHECK_NOTHROW(test::check_same_bits_on_every_rank(r.params[0]));    // every rank's
      if (steps == 2) CHECK(test::relative_difference(r.params[0], one) < 1e-5);
      if (steps == 20) {
        CHECK(test::relative_difference(r.params[0], many) < 1e-5);
        CHECK(r.test_acc.size() == 1);
      }
    }
}

TEST_CASE("--dist with DDP's buckets (0 = per parameter, 0.1 MB, all in one) == without buckets, 20 steps") {
  const int k = local_devices();
  auto alone = scratch::train(small(dist::world_size() * k, 20)).params[0];
  for (const char* algo : {"library", "ring"})
    for (double mb : {0.0, 0.1, 25.0}) {
      CAPTURE(mb);
      CAPTURE(algo);
      scratch::Config plain = small(k, 20);
      plain.dist = true;
      plain.dist_allreduce = algo;
      plain.bucket_mb = -1;  // the section's loop: one allreduce per parameter after backward
      auto unbucketed = scratch::train(plain).params[0];
      scratch::Config c = small(k, 20);
      c.dist = true;
      c.bucket_mb = mb;
      c.dist_allreduce = algo;
      scratch::Result r = scratch::train(c);
      for (size_t d = 1; d < r.params.size(); ++d) CHECK(r.params[d] == r.params[0]);
      CHECK_NOTHROW(test::check_same_bits_on_every_rank(r.params[0]));
      // Two ranks: a + b is the same sum whatever the message sizes, so 1e-6. Three: the library
      // picks its reduction order by message size and the ring cuts chunks by buffer length, so a
      // bucket sums (a + b) + c where a parameter alone may get a + (b + c): rounding, magnified by training.
      CHECK(test::relative_difference(r.params[0], unbucketed) < (dist::world_size() == 2 ? 1e-6 : 1e-4));
      CHECK(test::relative_difference(r.params[0], alone) < 1e-4);
    }
}

// Skipped (reported as such) in a world of one: there is no other rank to disagree with.
TEST_CASE("--dist: ranks that disagree get one error, not a hang" * doctest::skip(dist::world_size() == 1)) {
  scratch::Config c = small(local_devices(), 2);
  c.dist = true;
  if (dist::rank() == 1) c.lr = 0.1f;
  CHECK_THROWS_AS(scratch::train(c), dist::CollectiveError);
}
