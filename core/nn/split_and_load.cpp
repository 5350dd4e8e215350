#include "core/nn/split_and_load.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "core/autograd.hpp"
#include "core/copy.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

namespace d2l::nn {

namespace {

void check_devices(const std::vector<Device>& devices) {
  if (devices.empty()) throw ConfigError("split_and_load: no devices to load onto");
}

int64_t rows_of(const Shape& shape) {
  if (shape.empty()) throw ShapeError("split_and_load: data needs a batch axis, got shape " + str(shape));
  if (shape[0] <= 0) throw ShapeError("split_and_load: the batch is empty, shape " + str(shape));
  return shape[0];
}

// Shard i (sizes[i] rows, skipped when 0) goes to devices[i]; copy_rows(dst, first_row) fills it.
template <class CopyRows>
std::vector<Tensor> load(const Shape& shape, DType dtype, const std::vector<int64_t>& sizes,
                         const std::vector<Device>& devices, CopyRows copy_rows) {
  std::vector<Tensor> out;
  int64_t row = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == 0) continue;
    Shape s = shape;
    s[0] = sizes[i];
    Tensor dst = Tensor::empty(s, devices[i], dtype);
    copy_rows(dst, row);
    out.push_back(dst);
    row += sizes[i];
  }
  return out;
}

std::vector<Tensor> split_tensor(const Tensor& data, const std::vector<Device>& devices,
                                 const std::vector<int64_t>& sizes) {
  if (sizes.size() == 1 && data.device() == devices[0]) return {data};  // Gluon: as_in_context, no copy
  const size_t row_bytes = static_cast<size_t>(data.numel() / data.dim(0)) * 4;  // float32 and int32
  if (data.needs_grad() && grad_enabled()) {  // differentiable copies: slice, then to()
    std::vector<Tensor> out;
    int64_t row = 0;
    for (size_t i = 0; i < sizes.size(); row += sizes[i], ++i)
      if (sizes[i] > 0) out.push_back(slice_rows(data, row, row + sizes[i]).to(devices[i]));
    return out;
  }
  return load(data.shape(), data.dtype(), sizes, devices, [&](const Tensor& dst, int64_t row) {
    copy_bytes(data, static_cast<size_t>(row) * row_bytes, dst, 0, static_cast<size_t>(dst.dim(0)) * row_bytes);
  });
}

template <class T>
std::vector<Tensor> split_host(const std::vector<T>& values, const Shape& shape, DType dtype,
                               const std::vector<Device>& devices, const std::vector<int64_t>& sizes) {
  if (static_cast<int64_t>(values.size()) != numel(shape))
    throw ShapeError("split_and_load: " + std::to_string(values.size()) + " values do not fill shape " + str(shape));
  const int64_t row_elems = numel(shape) / shape[0];
  return load(shape, dtype, sizes, devices, [&](const Tensor& dst, int64_t row) {
    copy_from_host(values.data() + row * row_elems, static_cast<size_t>(dst.numel()) * sizeof(T), dst);
  });
}

BatchShards split_batch(const HostBatch& b, const std::vector<Device>& devices, const std::vector<int64_t>& sizes) {
  if (b.shape.empty() || b.shape[0] != b.n || static_cast<int64_t>(b.y.size()) != b.n)
    throw ShapeError("split_and_load: a batch of " + std::to_string(b.n) + " examples with X shape " + str(b.shape) +
                     " and " + std::to_string(b.y.size()) + " labels");
  return {split_host(b.X, b.shape, DType::f32, devices, sizes), split_host(b.y, {b.n}, DType::i32, devices, sizes)};
}

std::vector<int64_t> weighted_sizes(int64_t n, const std::vector<Device>& devices, const std::vector<double>& weights) {
  check_devices(devices);
  if (weights.size() != devices.size())
    throw ConfigError("split_and_load: " + std::to_string(weights.size()) + " weights for " +
                      std::to_string(devices.size()) + " devices");
  return shard_sizes(n, weights);
}

}  // namespace

std::vector<int64_t> even_shard_sizes(int64_t n, size_t devices, bool even_split) {
  const int64_t k = static_cast<int64_t>(devices);
  if (k < 1) throw ConfigError("split_and_load: no devices to load onto");
  if (n < 1) throw ShapeError("split_and_load: the batch is empty");
  if (even_split && n % k != 0)
    throw ShapeError("split_and_load: a batch of " + std::to_string(n) + " cannot be split evenly over " +
                     std::to_string(k) + " devices; use a batch size that is a multiple of " + std::to_string(k) +
                     " or even_split=false");
  std::vector<int64_t> sizes;
  for (int64_t i = 0; i < std::min(n, k); ++i) sizes.push_back(n / k + (i < n % k ? 1 : 0));
  return sizes;
}

std::vector<Tensor> split_and_load(const Tensor& data, const std::vector<Device>& devices, bool even_split) {
  check_devices(devices);
  return split_tensor(data, devices, even_shard_sizes(rows_of(data.shape()), devices.size(), even_split));
}

std::vector<Tensor> split_and_load(const std::vector<float>& values, const Shape& shape,
                                   const std::vector<Device>& devices, bool even_split) {
  check_devices(devices);
  auto sizes = even_shard_sizes(rows_of(shape), devices.size(), even_split);
  return split_host(values, shape, DType::f32, devices, sizes);
}

std::vector<Tensor> split_and_load(const std::vector<int32_t>& labels, const Shape& shape,
                                   const std::vector<Device>& devices, bool even_split) {
  check_devices(devices);
  auto sizes = even_shard_sizes(rows_of(shape), devices.size(), even_split);
  return split_host(labels, shape, DType::i32, devices, sizes);
}

BatchShards split_and_load(const HostBatch& batch, const std::vector<Device>& devices, bool even_split) {
  check_devices(devices);
  return split_batch(batch, devices, even_shard_sizes(batch.n, devices.size(), even_split));
}

std::vector<int64_t> shard_sizes(int64_t n, const std::vector<double>& weights) {
  if (weights.empty()) throw ConfigError("shard_sizes: no weights");
  if (n < 0) throw ShapeError("shard_sizes: a negative number of rows (" + std::to_string(n) + ")");
  double total = 0;
  for (size_t i = 0; i < weights.size(); ++i) {
    if (!std::isfinite(weights[i]) || weights[i] <= 0) {
      std::ostringstream os;
      os << "shard_sizes: weight " << i << " is " << weights[i] << "; weights must be positive and finite";
      throw ConfigError(os.str());
    }
    total += weights[i];
  }
  const size_t k = weights.size();
  std::vector<int64_t> sizes(k);
  std::vector<double> frac(k);
  int64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const double quota = static_cast<double>(n) * weights[i] / total;
    sizes[i] = std::min<int64_t>(n, static_cast<int64_t>(std::floor(quota)));
    frac[i] = quota - std::floor(quota);
    given += sizes[i];
  }
  // Largest remainders first; a stable sort gives ties to the earlier device.
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return frac[a] > frac[b]; });
  for (size_t j = 0; given < n; j = (j + 1) % k) ++sizes[order[j]], ++given;
  while (given > n) {  // rounding of the quotas overshot (never by more than a row or two)
    --*std::max_element(sizes.begin(), sizes.end());
    --given;
  }
  if (n >= static_cast<int64_t>(k))
    for (auto& s : sizes)
      if (s == 0) {
        --*std::max_element(sizes.begin(), sizes.end());  // the largest has >= 2 rows here
        s = 1;
      }
  return sizes;
}

std::vector<Tensor> split_and_load(const Tensor& data, const std::vector<Device>& devices,
                                   const std::vector<double>& weights) {
  return split_tensor(data, devices, weighted_sizes(rows_of(data.shape()), devices, weights));
}

BatchShards split_and_load(const HostBatch& batch, const std::vector<Device>& devices, const std::vector<double>& weights) {
  return split_batch(batch, devices, weighted_sizes(batch.n, devices, weights));
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::vector<double> probe_weights(const std::vector<Device>& devices, const ProbeStep& step, const Timer& timer,
                                  int repeats) {
  if (devices.empty()) throw ConfigError("probe_weights: no devices to probe");
  if (repeats < 1) throw ConfigError("probe_weights: repeats must be >= 1, got " + std::to_string(repeats));
  std::vector<double> speed;
  for (const Device& d : devices) {
    step(d);  // warm-up: first allocations, caches
    waitall();
    double best = std::numeric_limits<double>::infinity();
    for (int r = 0; r < repeats; ++r) {
      const double t0 = timer();
      step(d);
      waitall();
      best = std::min(best, timer() - t0);
    }
    if (!(best > 0) || !std::isfinite(best))
      throw ConfigError("probe_weights: the probe on " + d.str() + " took no measurable time; give it more work");
    speed.push_back(1.0 / best);
  }
  const double total = std::accumulate(speed.begin(), speed.end(), 0.0);
  for (auto& s : speed) s /= total;
  return speed;
}

}  // namespace d2l::nn
