// Ring synchronization, measured: the collectives benchmark. For each message size and algorithm,
// every rank runs the allreduce back to back for about cfg.seconds_per_point; the time of one is the
// slowest rank's mean. algbw = bytes / time; busbw = algbw * 2(W-1)/W, the bandwidth each link
// carries in a ring (nccl-tests' convention), so the algorithms compare on one scale. The naive
// algorithm moves the whole tensor W-1 times into rank 0 and W-1 times out: its busbw shows how much
// worse that is than the ring, whose links all work at once.
#include <algorithm>
#include <chrono>

#include "chapters/distributed/distributed.hpp"
#include "core/cli.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

namespace d2l::distributed {

double max_over_ranks(double x) {
  double m = x;
  for (auto& s : dist::gather_strings(std::to_string(x))) m = std::max(m, std::stod(s));
  return m;
}

namespace {

// Seconds per allreduce of t with `algorithm`, `iters` of them back to back, the slowest rank's.
double time_allreduce(const Tensor& t, const std::string& algorithm, int iters) {
  waitall();
  dist::barrier();
  auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) dist::allreduce(t, algorithm);
  waitall();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
  return max_over_ranks(s);
}

}  // namespace

std::vector<BandwidthRow> bandwidth(const Config& cfg) {
  const int W = dist::world_size();
  const Device d = cfg.devices[0];
  std::vector<BandwidthRow> rows;
  for (double bytes : cfg.sizes) {
    check_interrupt();
    const int64_t n = std::max<int64_t>(1, static_cast<int64_t>(bytes / 4));
    Tensor t = Tensor::full({n}, 1.0f / static_cast<float>(W), d);
    for (const char* algo : {"naive", "ring", "library"}) {
      const double once = time_allreduce(t, algo, 1);  // also the warm-up
      // The same count on every rank (rank 0's), so that the collectives pair up.
      const int mine = static_cast<int>(std::clamp(cfg.seconds_per_point / std::max(once, 1e-6), 1.0, 200.0));
      const int iters = std::stoi(dist::gather_strings(std::to_string(mine))[0]);
      BandwidthRow r;
      r.bytes = 4.0 * static_cast<double>(n);
      r.algorithm = algo;
      r.seconds = time_allreduce(t, algo, iters);
      r.algbw = r.bytes / r.seconds / 1e9;
      r.busbw = r.algbw * 2.0 * (W - 1) / W;
      rows.push_back(r);
    }
  }
  return rows;
}

double latency_bound_below(const std::vector<BandwidthRow>& rows, const std::string& algorithm) {
  double peak = 0;
  for (auto& r : rows)
    if (r.algorithm == algorithm) peak = std::max(peak, r.busbw);
  for (auto& r : rows)  // sizes ascending: the first that reaches half the peak
    if (r.algorithm == algorithm && r.busbw >= 0.5 * peak) return r.bytes;
  return 0;
}

}  // namespace d2l::distributed
