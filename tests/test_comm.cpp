// Collectives with closed-form data: device i holds i+1; afterwards every device holds
// the exact sum, bitwise equal across devices. Byte counters show where the data went.
#include <doctest/doctest.h>

#include "check.hpp"
#include "core/comm.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"
#include "tests/first_devices.hpp"

using namespace d2l;

namespace {
std::vector<Device> cpus(int n) { return test::first_devices(n, DeviceKind::cpu, false); }
std::vector<Tensor> filled(const std::vector<Device>& ds, int64_t len) {
  std::vector<Tensor> out;
  for (size_t i = 0; i < ds.size(); ++i) out.push_back(Tensor::full({len}, static_cast<float>(i + 1), ds[i]));
  return out;
}
}  // namespace

TEST_CASE("naive and ring allreduce: every device holds the exact sum, bitwise equal") {
  for (const char* algo : {"naive", "ring"})
    for (int n = 1; n <= 4; ++n)
      for (int64_t len : {1, 7, 10, 1001}) {
        CAPTURE(algo);
        CAPTURE(n);
        CAPTURE(len);
        auto ds = cpus(n);
        use_devices(ds);
        auto data = filled(ds, len);
        allreduce(data, algo);
        const float want = n * (n + 1) / 2.0f;
        auto first = data[0].to_vector();
        CHECK(first == std::vector<float>(len, want));
        for (auto& t : data) CHECK(t.to_vector() == first);
      }
}

TEST_CASE("ring equals naive within float reassociation on random data") {
  auto ds = cpus(3);
  use_devices(ds);
  std::vector<Tensor> a, b;
  std::vector<double> ref(1000, 0.0);
  for (size_t i = 0; i < ds.size(); ++i) {
    auto v = test::lcg_data(1000, static_cast<uint32_t>(i + 1));
    for (size_t k = 0; k < v.size(); ++k) ref[k] += v[k];
    a.push_back(Tensor::from_vector(v, {1000}, ds[i]));
    b.push_back(Tensor::from_vector(v, {1000}, ds[i]));
  }
  allreduce_naive(a);
  allreduce_ring(b);
  CHECK(test::close(ref, a[2].to_vector(), 1e-6, 1e-6, "naive"));
  CHECK(test::close(ref, b[2].to_vector(), 1e-6, 1e-6, "ring"));
  CHECK(b[0].to_vector() == b[2].to_vector());
}

TEST_CASE("ring: each device sends 2(n-1)/n of the data; naive concentrates it on device 0") {
  const int n = 4;
  const int64_t len = 1000, bytes = len * 4;
  auto ds = cpus(n);
  use_devices(ds);
  auto data = filled(ds, len);
  waitall();
  reset_copy_counters();
  allreduce_ring(data);
  waitall();
  for (auto d : ds) {
    CAPTURE(d.str());
    CHECK(copy_counters(d).bytes_out == 2 * (n - 1) * bytes / n);
    CHECK(copy_counters(d).bytes_in == 2 * (n - 1) * bytes / n);
  }
  reset_copy_counters();
  allreduce_naive(data);
  waitall();
  CHECK(copy_counters(cpu(0)).bytes_in == (n - 1) * bytes);
  CHECK(copy_counters(cpu(0)).bytes_out == (n - 1) * bytes);
  CHECK(copy_counters(cpu(1)).bytes_out == bytes);
  CHECK_THROWS_AS(allreduce(data, "tree"), ConfigError);
}
