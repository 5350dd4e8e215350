// Synchronised batch norm: the three differentiable pieces (statistics, combine, apply), the running
// statistics, and sync_batch_norm joining them across devices. Backward beside forward.
#include <algorithm>
#include <climits>

#include "core/ops.hpp"
#include "core/ops/op.hpp"

namespace d2l {
using namespace detail;
namespace k = kernels::cpu;

namespace {

struct Dims {
  int64_t N, C, HW;
  int64_t per_channel() const { return N * HW; }
};

// x (N, C) or (N, C, H, W), float32 -> (N, C, HW).
Dims dims_of(const char* op, const Tensor& x) {
  expect_f32(op, x, "x");
  if (x.ndim() != 2 && x.ndim() != 4) fail(op, "x must be (N, C) or (N, C, H, W), got " + str(x.shape()));
  return {x.dim(0), x.dim(1), x.ndim() == 4 ? x.dim(2) * x.dim(3) : 1};
}

void expect_shape(const char* op, const Tensor& t, const Shape& want, const char* what) {
  expect_f32(op, t, what);
  if (t.shape() != want) fail(op, std::string(what) + " must be " + str(want) + ", got " + str(t.shape()));
}

}  // namespace

Tensor batch_norm_stats(const Tensor& x_in) {
  const Tensor x = autocast_input("batch_norm_stats", x_in);
  const Dims s = dims_of("batch_norm_stats", x);
  if (s.per_channel() < 1) fail("batch_norm_stats", "needs at least one value per channel, got " + str(x.shape()));
  Device d = x.device();
  Tensor stats = Tensor::empty({2, s.C}, d);
  const float* X = x.data();
  float* S = stats.data();
  launch(d, "batch_norm_stats", keep({x, stats}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_stats_forward, s.N, s.C, s.HW, X, S); });
  // The node keeps a detached handle: `stats` itself would own its node and never be freed.
  record(stats, "batch_norm_stats", {x}, [x, saved = stats.detach(), s](const Tensor& gs) {
    Tensor gx = Tensor::empty(x.shape(), x.device());
    const float *X = x.data(), *S = saved.data(), *GS = gs.data();
    float* GX = gx.data();
    launch(x.device(), "batch_norm_stats_backward", keep({x, saved, gs, gx}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_stats_backward, s.N, s.C, s.HW, X, S, GS, GX); });
    return std::vector<Tensor>{gx};
  });
  return stats;
}

Tensor batch_norm_combine_stats(const Tensor& stats, const std::vector<int64_t>& counts) {
  const char* op = "batch_norm_combine_stats";
  expect_f32(op, stats, "stats");
  const int64_t K = static_cast<int64_t>(counts.size());
  if (K < 1) fail(op, "needs at least one shard");
  if (stats.ndim() != 2 || stats.dim(0) != 2 * K)
    fail(op, "stats of " + std::to_string(K) + " shards must be (" + std::to_string(2 * K) + ", C), got " +
                 str(stats.shape()));
  std::vector<int32_t> n32;
  for (int64_t n : counts) {
    if (n < 1 || n > INT32_MAX) fail(op, "values per channel of a shard must be in [1, 2^31), got " + std::to_string(n));
    n32.push_back(static_cast<int32_t>(n));
  }
  const int64_t C = stats.dim(1);
  Device d = stats.device();
  Tensor n_t = Tensor::from_vector(n32, {K}, d), out = Tensor::empty({2, C}, d);
  const int32_t* NC = n_t.labels();
  const float* S = stats.data();
  float* O = out.data();
  launch(d, op, keep({n_t, stats, out}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_combine_forward, K, C, NC, S, O); });
  record(out, op, {stats}, [stats, n_t, K, C](const Tensor& gout) {
    Tensor gs = Tensor::empty(stats.shape(), stats.device());
    const int32_t* NC = n_t.labels();
    const float *S = stats.data(), *GO = gout.data();
    float* GS = gs.data();
    launch(stats.device(), "batch_norm_combine_stats_backward", keep({n_t, stats, gout, gs}),
           [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_combine_backward, K, C, NC, S, GO, GS); });
    return std::vector<Tensor>{gs};
  });
  return out;
}

Tensor batch_norm_apply(const Tensor& x_in, const Tensor& stats, const Tensor& gamma_in, const Tensor& beta_in, float eps) {
  const Tensor x = autocast_input("batch_norm_apply", x_in);
  const Tensor gamma = autocast_input("batch_norm_apply", gamma_in);
  const Tensor beta = autocast_input("batch_norm_apply", beta_in);
  const char* op = "batch_norm_apply";
  Device d = same_device(op, {x, stats, gamma, beta});
  const Dims s = dims_of(op, x);
  expect_shape(op, stats, {2, s.C}, "stats");
  expect_shape(op, gamma, {s.C}, "gamma");
  expect_shape(op, beta, {s.C}, "beta");
  Tensor y = Tensor::empty(x.shape(), d);
  const float *X = x.data(), *S = stats.data(), *G = gamma.data(), *B = beta.data();
  float* Y = y.data();
  launch(d, op, keep({x, stats, gamma, beta, y}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_apply_forward, s.N, s.C, s.HW, X, S, G, B, eps, Y); });
  record(y, op, {x, stats, gamma, beta}, [x, stats, gamma, s, eps](const Tensor& gy) {
    Device d = x.device();
    Tensor gx = Tensor::empty(x.shape(), d), gs = Tensor::empty({2, s.C}, d);
    Tensor gg = Tensor::empty({s.C}, d), gb = Tensor::empty({s.C}, d);
    const float *X = x.data(), *GY = gy.data(), *S = stats.data(), *G = gamma.data();
    float *GX = gx.data(), *GS = gs.data(), *GG = gg.data(), *GB = gb.data();
    launch(d, "batch_norm_apply_backward", keep({x, gy, stats, gamma, gx, gs, gg, gb}), [=](const LaunchCtx& c) {
      D2L_KERNEL(c, batch_norm_apply_backward, s.N, s.C, s.HW, X, GY, S, G, eps, GX, GS, GG, GB);
    });
    return std::vector<Tensor>{gx, gs, gg, gb};
  });
  return y;
}

void batch_norm_update_running_(const Tensor& stats, int64_t count, const Tensor& running_mean,
                                const Tensor& running_var, float momentum) {
  const char* op = "batch_norm_update_running_";
  Device d = same_device(op, {stats, running_mean, running_var});
  const int64_t C = running_mean.numel();
  expect_shape(op, stats, {2, C}, "stats");
  expect_shape(op, running_mean, {C}, "running_mean");
  expect_shape(op, running_var, {C}, "running_var");
  if (count < 1) fail(op, "count must be >= 1, got " + std::to_string(count));
  const float* S = stats.data();
  float *RM = running_mean.data(), *RV = running_var.data();
  launch(d, op, keep({stats, running_mean, running_var}),
         [=](const LaunchCtx& c) { D2L_KERNEL(c, batch_norm_update_running, C, count, S, momentum, RM, RV); });
}

std::vector<Tensor> sync_batch_norm(const std::vector<Tensor>& xs, const std::vector<Tensor>& gamma,
                                    const std::vector<Tensor>& beta, const std::vector<Tensor>& running_mean,
                                    const std::vector<Tensor>& running_var, float momentum, float eps) {
  const char* op = "sync_batch_norm";
  const size_t K = xs.size();
  if (K == 0) fail(op, "needs at least one shard");
  if (gamma.size() != K || beta.size() != K || running_mean.size() != K || running_var.size() != K)
    fail(op, "needs one gamma, beta, running_mean and running_var per shard (" + std::to_string(K) + " shards)");
  // Every shard: one device for its tensors, the same shape beyond axis 0, (C) per-channel tensors.
  const Dims first = dims_of(op, xs[0]);
  const Shape tail(xs[0].shape().begin() + 1, xs[0].shape().end());
  int64_t total = 0;
  for (size_t j = 0; j < K; ++j) {
    same_device(op, {xs[j], gamma[j], beta[j], running_mean[j], running_var[j]});
    const Dims s = dims_of(op, xs[j]);
    if (Shape(xs[j].shape().begin() + 1, xs[j].shape().end()) != tail)
      fail(op, "shards " + str(xs[0].shape()) + " and " + str(xs[j].shape()) + " differ beyond axis 0");
    for (const Tensor* t : {&gamma[j], &beta[j], &running_mean[j], &running_var[j]})
      expect_shape(op, *t, {first.C}, "per-channel tensors");
    total += s.per_channel();
  }

  std::vector<Tensor> ys(K);
  if (!is_training()) {  // each device's running statistics; nothing crosses devices
    for (size_t j = 0; j < K; ++j)
      ys[j] = xs[j].dim(0) == 0 ? Tensor::empty(xs[j].shape(), xs[j].device())
                                : batch_norm(xs[j], gamma[j], beta[j], running_mean[j], running_var[j], momentum, eps);
    return ys;
  }
  if (total < 2) {
    std::string shapes;
    for (auto& x : xs) shapes += (shapes.empty() ? "" : ", ") + str(x.shape());
    fail(op, "training needs more than one value per channel over all shards, got " + std::to_string(total) +
                 " (shards " + shapes + ")");
  }

  // Each non-empty shard's statistics, gathered on the first one's device and combined there.
  std::vector<Tensor> parts;
  std::vector<int64_t> counts;
  Device d0;
  for (size_t j = 0; j < K; ++j) {
    if (xs[j].dim(0) == 0) continue;
    if (parts.empty()) d0 = xs[j].device();
    parts.push_back(batch_norm_stats(xs[j]).to(d0));
    counts.push_back(xs[j].dim(0) * first.HW);
  }
  const Tensor global = batch_norm_combine_stats(parts.size() == 1 ? parts[0] : concat(parts), counts);

  // Back to every shard's device: normalise there, and update each replica's running statistics once.
  std::vector<std::pair<Device, Tensor>> global_on;
  std::vector<std::shared_ptr<Storage>> updated;
  for (size_t j = 0; j < K; ++j) {
    const Device d = xs[j].device();
    auto it = std::find_if(global_on.begin(), global_on.end(), [&](auto& p) { return p.first == d; });
    const Tensor g = it != global_on.end() ? it->second : global_on.emplace_back(d, global.to(d)).second;
    if (std::find(updated.begin(), updated.end(), running_mean[j].storage()) == updated.end()) {
      updated.push_back(running_mean[j].storage());
      batch_norm_update_running_(g, total, running_mean[j], running_var[j], momentum);
    }
    ys[j] = xs[j].dim(0) == 0 ? Tensor::empty(xs[j].shape(), d) : batch_norm_apply(xs[j], g, gamma[j], beta[j], eps);
  }
  return ys;
}

}  // namespace d2l
