// Chapter 2 with kvstore dist_sync, run as 1, 2 and 3 processes (tests/dist/mpirun.sh): P processes
// x k devices (D2L_TEST_LOCAL_DEVICES, default 1) train the lab's CNN as 1 process x P*k devices
// does (within 1e-5 relative after 20 steps), with the same bits on every rank; a checkpoint written
// by rank 0 and read by every rank resumes exactly as an uninterrupted run.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>

#include "chapters/multi_gpu_concise/multi_gpu_concise.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/process_group.hpp"
#include "core/runtime.hpp"
#include "datasets/synthetic.hpp"
#include "tests/dist/dist_check.hpp"
#include "tests/first_devices.hpp"
#include "tests/small_run.hpp"

using namespace d2l;
using concise::Config;

namespace {

int local_devices() {
  const char* v = std::getenv("D2L_TEST_LOCAL_DEVICES");
  return v ? std::atoi(v) : 1;
}

// The lab's CNN, 20 steps of batch 24 a epoch on generated 28x28 images.
Config lab_small(int devices, const std::string& kvstore) {
  Config c = test::small_run<Config>(test::first_devices(devices), {.train_images = 480, .test_images = 50,
                                                                    .image_size = 28, .data_seed = 11,
                                                                    .batch_size = 24, .lr = 0.3f, .seed = 3});
  c.model = "lab-cnn";
  c.kvstore = kvstore;
  return c;
}

}  // namespace

TEST_CASE("kvstore dist_sync: P processes x k devices == 1 process x P*k devices, the same bits on every rank") {
  const int W = dist::world_size(), k = local_devices();
  CAPTURE(W);
  CAPTURE(k);
  auto many = concise::trained_values(concise::train(lab_small(W * k, "device")));
  for (const char* kv : {"dist_sync", "dist_sync_ring"}) {
    CAPTURE(kv);
    concise::Result r = concise::train(lab_small(k, kv));
    auto mine = concise::trained_values(r);
    // Equal up to float rounding (three ranks may sum in another association than one process's
    // devices do), magnified by 20 steps at lr 0.3.
    CHECK(test::relative_difference(mine, many) < (W <= 2 ? 1e-5 : 1e-4));
    CHECK_NOTHROW(test::check_same_bits_on_every_rank(mine));
    REQUIRE(r.test_acc.size() == 1);
    CHECK(dist::sum_over_ranks({r.test_acc[0]})[0] == doctest::Approx(W * r.test_acc[0]));  // one accuracy for all
  }
}

// A short last minibatch smaller than the devices: some rank's share is empty; it takes part
// in the sums with zero gradients, as an empty device does in one process. (The trainable
// parameters.)
TEST_CASE("kvstore dist_sync: a rank whose share of the last minibatch is empty trains as an empty device does") {
  const int W = dist::world_size(), k = local_devices();
  CAPTURE(W);
  // 20 minibatches of 24, then one of max(1, W*k/2) images: at least one shard of W*k is empty.
  const int64_t last = std::max<int64_t>(1, W * k / 2);
  auto short_last = [last](Config c) {
    c.train_data = make_image_classification(480 + last, 28, 10, 11);
    return c;
  };
  auto trainable = [](const concise::Result& r) {
    std::vector<std::vector<float>> out;
    for (auto& p : r.net->collect_params().trainable()) out.push_back(p->data(r.devices[0]).to_vector());
    return out;
  };
  auto many = trainable(concise::train(short_last(lab_small(W * k, "device"))));
  concise::Result r = concise::train(short_last(lab_small(k, "dist_sync")));
  auto mine = trainable(r);
  CHECK(test::relative_difference(mine, many) < (W <= 2 ? 1e-5 : 1e-4));
  CHECK_NOTHROW(test::check_same_bits_on_every_rank(mine));
}

TEST_CASE("kvstore dist_sync with DDP's buckets (0, 0.1 MB, all in one) == without buckets, bitwise equal ranks") {
  const int k = local_devices();
  Config plain = lab_small(k, "dist_sync");
  plain.bucket_mb = -1;
  auto unbucketed = concise::trained_values(concise::train(plain));
  for (double mb : {0.0, 0.1, 1000.0}) {
    CAPTURE(mb);
    Config c = lab_small(k, "dist_sync");
    c.bucket_mb = mb;
    auto mine = concise::trained_values(concise::train(c));
    // Two ranks: bitwise the same sums, so 1e-6; three: another association (see chapter 1's test).
    CHECK(test::relative_difference(mine, unbucketed) < (dist::world_size() <= 2 ? 1e-6 : 1e-4));
    CHECK_NOTHROW(test::check_same_bits_on_every_rank(mine));
  }
}

// --comm-hook bf16_compress: the same training with the buckets summed in bfloat16. Its parameters
// stay equal on every rank and differ from the float32 buckets' (the hook rounded the sums); 20
// steps at lr 0.3 magnify a gradient's rounding far beyond it (tests/test_dist_buckets.cpp bounds
// the sums themselves), so what is compared after them is the accuracy.
TEST_CASE("kvstore dist_sync with DDP's bf16_compress hook: equal ranks, another trajectory, as accurate") {
  const int k = local_devices();
  Config c = lab_small(k, "dist_sync");
  concise::Result f32 = concise::train(c);
  c.comm_type = DType::bf16;
  concise::Result bf16 = concise::train(c);
  auto a = concise::trained_values(f32), b = concise::trained_values(bf16);
  CHECK_NOTHROW(test::check_same_bits_on_every_rank(b));
  const double diff = test::relative_difference(b, a);
  MESSAGE("bf16_compress against float32 buckets: relative difference " << diff << ", accuracy " << bf16.test_acc[0]
                                                                          << " against " << f32.test_acc[0]);
  if (dist::world_size() > 1) CHECK(diff > 1e-6);
  CHECK(bf16.test_acc[0] >= f32.test_acc[0] - 0.15);
}

TEST_CASE("kvstore dist_sync: rank 0's checkpoint resumes every rank as an uninterrupted run") {
  const int k = local_devices();
  const std::string path = (std::filesystem::temp_directory_path() / "d2l_dist_resume.ckpt").string();
  Config whole = lab_small(k, "dist_sync");
  whole.num_epochs = 2;
  auto uninterrupted = concise::trained_values(concise::train(whole));
  Config first = whole;
  first.num_epochs = 1;
  first.checkpoint = path;
  concise::train(first);
  dist::barrier();  // rank 0 has written it
  Config second = whole;
  second.resume = path;
  auto resumed = concise::trained_values(concise::train(second));
  CHECK(resumed == uninterrupted);
  dist::barrier();
  if (dist::rank() == 0) std::filesystem::remove(path);
}

// Skipped (reported as such) in a world of one: there is no other rank to disagree with.
TEST_CASE("kvstore dist_sync: a mismatched configuration is one error on every rank, not a hang" *
          doctest::skip(dist::world_size() == 1)) {
  Config c = lab_small(local_devices(), "dist_sync");
  if (dist::rank() == dist::world_size() - 1) c.batch_size = 12;
  CHECK_THROWS_AS(concise::train(c), dist::CollectiveError);
}
