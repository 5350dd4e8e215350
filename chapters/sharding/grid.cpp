// Part 3, the grid: data and tensor parallelism together, over processes (Megatron-LM's model- and
// data-parallel groups; picotron's layout). The world's W ranks, one device each, are arranged as
// dp x tp (core/dist/grid.hpp): each tp group (a row of tp consecutive ranks) holds one copy of part
// 2's classifier
//
//   X (784) -> Dense(d_model, relu) -> [ Dense(hidden, relu) -> Dense(d_model) ] -> relu -> Dense(10)
//
// with the bracketed MLP split over its ranks (each rank builds only its own slice, tp::shard_mlp over
// the group), and the two outer layers whole on every rank. The dp groups (the columns) split each
// minibatch: dp rank j takes the j-th part of it, the same part on every rank of its row.
//
// A step on a rank: forward and backward on its part of the batch, f and g summing over its row, so
// every rank holds the gradient of its part's loss for the tensors it keeps. The whole batch's
// gradient is the sum over the parts: each gradient is allreduced over the rank's column, the ranks
// that hold the same tensor (the same slice of the MLP, or a replicated layer). Never over the row:
// the row's ranks hold different slices, or, for the replicated layers and the row layer's bias, the
// same whole gradient already (g's backward is the identity), which a sum over the row would count
// tp times. Then every rank updates what it holds, by the same SGD as the unsharded run, through a
// Trainer whose dist_sync kvstore sums over the column (OptimizerOptions::dp_group). With
// --grid-zero-stage 1 (the default) the column also shards the optimizer state, ZeRO-1 over the dp
// group (Megatron-LM's distributed optimizer): the gradients reduce-scattered over the column, each
// rank updating its 1/dp chunk of what it holds, then all-gathered; 2 keeps only its chunk's summed
// gradient too; 0 replicates the state over the column. --clip-grad-norm clips by the norm of the
// whole model's gradient: the slices' squares added over the row (OptimizerOptions::tp_group), the
// replicated tensors' counted once.
//
// The check: the same classifier trained by one process on the whole batch (rank 0, after the grid
// run) gives the same losses (and, when clipping, the same gradient norms) within rounding over the
// first steps, each rank's optimizer state, measured from its allocator, is what the stage keeps,
// every rank's tensors then equal
// their slices of the unsharded ones within rounding, and the tensors that several ranks hold have
// the same bits on each of them. (Over a long run rounding's differences grow, as in part 2.)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "chapters/sharding/sharding.hpp"
#include "core/autograd.hpp"
#include "core/cli.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/fingerprint.hpp"
#include "core/dist/grid.hpp"
#include "core/dist/process_group.hpp"
#include "core/nn/dense.hpp"
#include "core/nn/sequential.hpp"
#include "core/ops.hpp"
#include "core/optim/grad_scaler.hpp"
#include "core/optim/trainer.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"
#include "core/tensor_parallel/megatron_mlp.hpp"

namespace d2l::sharding {

namespace {

constexpr int kCheckedSteps = 10;  // the check covers the first steps

// The classifier as one rank holds it: `mlp` is the plain fc1 -> fc2 (the unsharded run) or this
// rank's slice of the Megatron MLP over its tp group.
struct RankNet {
  std::shared_ptr<nn::Dense> embed, out;
  std::shared_ptr<nn::Block> mlp;
  // The tensors compared between the runs, in this order: embed's weight and bias, fc1's weight and
  // bias, fc2's weight and bias, out's weight and bias (of the MLP, this rank's slices in the grid).
  std::vector<nn::ParameterPtr> compared;

  Tensor operator()(const Tensor& x) { return (*out)(relu((*mlp)((*embed)(x)))); }
  std::vector<nn::ParameterPtr> params() const {
    std::vector<nn::ParameterPtr> ps;
    for (auto& [name, p] : named_params()) ps.push_back(p);
    return ps;
  }
  // What a Trainer updates: "embed.weight", ..., "mlp.<this rank's slice>", ..., "out.bias".
  nn::ParameterDict named_params() const {
    nn::ParameterDict d;
    const std::pair<const char*, const nn::Block*> blocks[] = {{"embed.", embed.get()}, {"mlp.", mlp.get()}, {"out.", out.get()}};
    for (const auto& [prefix, b] : blocks)
      for (auto& [name, p] : b->collect_params())
        if (p->differentiable()) d.add(prefix + name, p);
    return d;
  }
};

// A Dense on `d` with the values of `from`.
std::shared_ptr<nn::Dense> copy_dense(const nn::Dense& from, int64_t units, const std::string& activation, int64_t in_units,
                                      Device d) {
  auto c = std::make_shared<nn::Dense>(units, activation, true, in_units);
  c->collect_params().initialize(Init::Zero(), {d});
  c->weight->set_data(from.weight->list_data()[0].to(d));
  c->bias->set_data(from.bias->list_data()[0].to(d));
  return c;
}

using Values = std::vector<std::vector<float>>;  // tensors as host values
Values values_of(const std::vector<nn::ParameterPtr>& ps) {
  Values v;
  for (auto& p : ps) v.push_back(p->list_data()[0].to_vector());
  return v;
}

struct RunLog {
  std::vector<double> steps;                 // each step's mean loss over the whole batch
  std::vector<double> norms;                 // each step's gradient norm (--clip-grad-norm > 0)
  int64_t state_bytes = 0;                   // the optimizer state this rank held after training (allocator)
  std::vector<double> epoch_loss, test_acc;  // per epoch
  tp::Traffic first_step;                    // what f and g sent in the first step
  int64_t first_part = 0;                    // this rank's examples in the first step
  Values at_check;                           // the compared tensors after step kCheckedSteps (or the last)
};

// Trains `net` on this rank's parts of the minibatches (the whole of them for the unsharded run,
// grid == nullptr). `counts_loss`: this rank's loss is the one its row reports (tp rank 0); the
// losses and correct counts are summed over the world, so every rank gets the whole batch's.
RunLog train_rank(RankNet& net, const Config& cfg, const DataIter& train_iter, const DataIter& test_iter, int64_t features,
                  Device dev, const dist::Grid* grid, bool counts_loss, const char* label) {
  RunLog log;
  auto over_world = [&](std::vector<double> v) {
    if (!counts_loss) v.assign(v.size(), 0.0);
    return grid ? dist::sum_over_ranks(v) : v;
  };
  // SGD (MXNet's sgd_mom_update: its momentum buffer is the state, kept at momentum 0 too). The
  // grid's kvstore sums over the column, and ZeRO shards over it; the unsharded run sums nothing.
  optim::OptimizerOptions o;
  o.learning_rate = cfg.lr;
  o.clip_grad_norm = cfg.clip_grad_norm;
  if (grid) o.zero_stage = cfg.grid_zero_stage, o.dp_group = grid->dp, o.tp_group = grid->tp;
  const int64_t state_before = runtime(dev).allocator->stats().held(MemoryTag::optimizer_state);
  optim::Trainer trainer(net.named_params(), "sgd", o, grid ? "dist_sync" : "device");
  optim::GradScaler scaler({.enabled = cfg.autocast == DType::f16});  // --precision fp16
  int64_t step = 0;
  for (int epoch = 0; epoch < cfg.num_epochs; ++epoch) {
    double loss_sum = 0;
    for (const Batch& b : train_iter.epoch(epoch)) {
      check_interrupt();
      if (step == 0) tp::reset_traffic();
      double loss = 0;
      if (b.n > 0) {  // a short last minibatch may leave a part empty: its gradients stay zero
        Tensor X = Tensor::from_vector(b.X, {b.n, features}, dev), y = Tensor::from_vector(b.y, {b.n}, dev);
        Autocast mixed(cfg.autocast);  // --precision bf16 / fp16 (f32: off)
        Tensor l = softmax_cross_entropy(net(X), y, Reduction::sum);
        scaler.scale(l).backward();
        loss = l.item();
      }
      // trainer.step: the whole minibatch's size: the gradients are summed over its parts
      const bool stepped = scaler.step(trainer, b.size());
      scaler.update();
      if (cfg.clip_grad_norm > 0) log.norms.push_back(trainer.last_grad_norm());
      if (step == 0) log.first_step = tp::traffic(), log.first_part = b.n;
      loss = over_world({loss})[0];
      ++step;
      check_loss(loss, stepped, epoch + 1, step);
      loss_sum += loss;
      log.steps.push_back(loss / static_cast<double>(b.size()));
      if (step == kCheckedSteps) log.at_check = values_of(net.compared);
    }
    // Accuracy on the test set, each row of the grid on its part of it.
    double correct = 0;
    {
      NoGrad no_grad;
      for (const Batch& b : test_iter.epoch(0))
        if (b.n > 0)
          correct += count_correct(net(Tensor::from_vector(b.X, {b.n, features}, dev)), Tensor::from_vector(b.y, {b.n}, dev)).item();
    }
    log.epoch_loss.push_back(loss_sum / static_cast<double>(train_iter.size()));
    log.test_acc.push_back(over_world({correct})[0] / static_cast<double>(test_iter.size()));
    std::printf("  %-9s epoch %d, loss %.4f, test acc %.3f\n", label, epoch + 1, log.epoch_loss.back(), log.test_acc.back());
    std::fflush(stdout);
  }
  if (log.at_check.empty()) log.at_check = values_of(net.compared);  // fewer steps than checked
  log.state_bytes = runtime(dev).allocator->stats().held(MemoryTag::optimizer_state) - state_before;
  return log;
}

// A 64-bit hash of tensors' bits: replicas compared across ranks.
std::string bits_hash(const std::vector<nn::ParameterPtr>& ps) {
  uint64_t h = 1469598103934665603ull;
  for (auto& p : ps)
    for (float x : p->list_data()[0].to_vector()) {
      uint32_t u;
      std::memcpy(&u, &x, 4);
      h = (h ^ u) * 1099511628211ull;
    }
  return std::to_string(h);
}

// max |a - b| / max |b| over one tensor given as host values.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double diff = 0, scale = 1e-30;
  for (size_t i = 0; i < a.size(); ++i) {
    diff = std::max(diff, std::fabs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::fabs(double(b[i])));
  }
  return diff / scale;
}

// Rows [r0, r0 + n) of a row-major matrix with C columns; columns [c0, c0 + n) of one.
std::vector<float> row_block(const std::vector<float>& m, int64_t C, int64_t r0, int64_t n) {
  return {m.begin() + r0 * C, m.begin() + (r0 + n) * C};
}
std::vector<float> column_block(const std::vector<float>& m, int64_t C, int64_t c0, int64_t n) {
  std::vector<float> out;
  for (int64_t r = 0; r < static_cast<int64_t>(m.size()) / C; ++r)
    out.insert(out.end(), m.begin() + r * C + c0, m.begin() + r * C + c0 + n);
  return out;
}

// The largest relative difference between a rank's compared tensors and their part of the unsharded
// ones: the outer layers whole, fc1's rows and fc2's columns [h0, h0 + h), fc2's bias whole.
double slice_difference(const Values& mine, const Values& whole, int64_t d_model, int64_t hidden, int64_t h0, int64_t h) {
  const Values part{whole[0], whole[1], row_block(whole[2], d_model, h0, h), row_block(whole[3], 1, h0, h),
                    column_block(whole[4], hidden, h0, h), whole[5], whole[6], whole[7]};
  double worst = 0;
  for (size_t i = 0; i < part.size(); ++i) worst = std::max(worst, rel_diff(mine[i], part[i]));
  return worst;
}

// Root's values on every rank (the shapes already the same everywhere).
Values broadcast_values(Values v, Device dev) {
  for (auto& t : v) {
    Tensor x = Tensor::from_vector(t, {static_cast<int64_t>(t.size())}, dev);
    dist::broadcast(x, 0);
    t = x.to_vector();
  }
  return v;
}

// The largest of every rank's value.
double max_over_ranks(double mine) {
  char text[32];
  std::snprintf(text, sizeof text, "%.17g", mine);
  double worst = 0;
  for (const std::string& s : dist::gather_strings(text)) worst = std::max(worst, std::stod(s));
  return worst;
}

}  // namespace

std::string grid_devices(const Config& cfg) {
  return std::to_string(dist::world_size()) + " process" + (dist::world_size() > 1 ? "es" : "") +
         ", one device each (the local rank's of " + str(cfg.devices) + ")";
}

void validate_grid(const Config& cfg) {
  const int W = dist::world_size();
  dist::check_grid(W, cfg.tp_size);
  const int dp = W / cfg.tp_size;
  if (cfg.hidden % cfg.tp_size != 0)
    throw dist::CollectiveError("bad --tp-size " + std::to_string(cfg.tp_size) + ": the hidden size " +
                                std::to_string(cfg.hidden) + " (--hidden) cannot be split evenly over " +
                                std::to_string(cfg.tp_size) + " processes");
  if (cfg.batch_size < dp)
    throw dist::CollectiveError("bad --batch-size " + std::to_string(cfg.batch_size) + ": smaller than the " +
                                std::to_string(dp) + " data-parallel groups, and every group needs at least one example");
}

int grid_over_processes(const Config& cfg) {
  const double rtol = rounding_tolerance(cfg.autocast);  // rounding's share of a loss, or of a tensor (relative to its largest value)
  validate_grid(cfg);
  dist::Grid grid(cfg.tp_size);
  const int W = dist::world_size();
  // One device per rank: the local rank's of the devices given (each rank is its own process).
  const Device dev = cfg.devices[static_cast<size_t>(dist::world().local_rank) % cfg.devices.size()];
  use_devices({dev});

  DataIter train_whole(*cfg.train_data, cfg.batch_size, true, cfg.seed), test_whole(*cfg.test_data, cfg.batch_size, false);
  DataIter train_part = train_whole, test_part = test_whole;  // this rank's row: its dp rank's part of each batch
  train_part.shard(grid.dp_size, grid.dp_rank, grid.dp_rank + 1);
  test_part.shard(grid.dp_size, grid.dp_rank, grid.dp_rank + 1);
  int64_t features = 1;
  for (int64_t s : train_whole.data().feature_shape) features *= s;

  std::printf("\n3. The grid over processes: %d process%s as %d dp x %d tp, one device each; %lld -> Dense(%lld, relu) -> "
              "[Dense(%lld, relu) -> Dense(%lld)] -> relu -> Dense(10), the bracketed MLP split over each tp group, each "
              "minibatch of %lld split over the %d dp groups; SGD lr %g, %d epochs\n",
              W, W > 1 ? "es" : "", grid.dp_size, grid.tp_size, (long long)features, (long long)cfg.d_model,
              (long long)cfg.hidden, (long long)cfg.d_model, (long long)cfg.batch_size, grid.dp_size, double(cfg.lr),
              cfg.num_epochs);
  const auto mapping = dist::describe_all(grid);
  const auto devices = dist::gather_strings(dev.str());
  for (int r = 0; r < W; ++r)
    std::printf("%s (on %s)\n", mapping[static_cast<size_t>(r)].c_str(), devices[static_cast<size_t>(r)].c_str());
  std::fflush(stdout);

  // The unsharded classifier, the same on every rank (same seed; checked), and this rank's share of it.
  manual_seed(cfg.seed);
  RankNet whole{std::make_shared<nn::Dense>(cfg.d_model, "relu", true, features),
                std::make_shared<nn::Dense>(10, "", true, cfg.d_model), nullptr, {}};
  auto fc1 = std::make_shared<nn::Dense>(cfg.hidden, "relu", true, cfg.d_model);
  auto fc2 = std::make_shared<nn::Dense>(cfg.d_model, "", true, cfg.hidden);
  auto plain = std::make_shared<nn::Sequential>();
  plain->add(fc1, fc2);
  whole.mlp = plain;
  for (const nn::Block* b : std::vector<const nn::Block*>{whole.embed.get(), plain.get(), whole.out.get()})
    b->collect_params().initialize(Init::Xavier(), {dev});
  whole.compared = {whole.embed->weight, whole.embed->bias, fc1->weight, fc1->bias,
                    fc2->weight,         fc2->bias,         whole.out->weight, whole.out->bias};
  {
    std::vector<Tensor> initial;
    for (auto& p : whole.params()) initial.push_back(p->list_data()[0]);
    dist::check_same_bits(initial, "the unsharded classifier's initial weights");
  }
  auto mlp = tp::shard_mlp(*fc1, *fc2, grid.tp, dev);
  RankNet mine{copy_dense(*whole.embed, cfg.d_model, "relu", features, dev), copy_dense(*whole.out, 10, "", cfg.d_model, dev),
               mlp, {}};
  const auto& fc1_slice = *mlp->fc1->shards()[0];
  const auto& fc2_slice = *mlp->fc2->shards()[0];
  mine.compared = {mine.embed->weight, mine.embed->bias, fc1_slice.weight, fc1_slice.bias,
                   fc2_slice.weight,   mlp->fc2->bias,   mine.out->weight, mine.out->bias};

  // The grid run: every rank on its part.
  std::printf("  the grid (losses and accuracy of the whole batch, summed over the tp groups):\n");
  const RunLog g = train_rank(mine, cfg, train_part, test_part, features, dev, &grid, grid.tp_rank == 0, "grid");
  const auto steps = static_cast<int64_t>(g.steps.size());

  // The unsharded run on rank 0 (the others wait), then its tensors sent to every rank.
  RunLog u;
  u.at_check = values_of(whole.compared);  // the shapes, on the ranks that do not train it
  if (dist::rank() == 0) {
    std::printf("  unsharded, one process on the whole batch:\n");
    u = train_rank(whole, cfg, train_whole, test_whole, features, dev, nullptr, true, "unsharded");
  }
  const Values whole_at_check = broadcast_values(u.at_check, dev);
  const Values whole_after = broadcast_values(values_of(whole.compared), dev);

  // 1. The losses (rank 0 has both runs).
  double first = 0, all = 0;
  if (dist::rank() == 0) {
    std::printf("epoch  loss 1 process    loss grid   rel diff  test acc 1  test acc grid\n");
    for (size_t e = 0; e < g.epoch_loss.size(); ++e)
      std::printf("%5zu  %14.6f %12.6f %10.1e %11.4f %14.4f\n", e + 1, u.epoch_loss[e], g.epoch_loss[e],
                  std::fabs(u.epoch_loss[e] - g.epoch_loss[e]) / std::fabs(u.epoch_loss[e]), u.test_acc[e], g.test_acc[e]);
    for (int64_t s = 0; s < steps; ++s) {
      const double d = std::fabs(u.steps[size_t(s)] - g.steps[size_t(s)]) / std::max(std::fabs(u.steps[size_t(s)]), 1e-30);
      all = std::max(all, d);
      if (s < kCheckedSteps) first = std::max(first, d);
    }
  }
  // 2. Every rank's tensors against their part of the unsharded ones, after the checked steps and at the end.
  const int64_t h = cfg.hidden / grid.tp_size, h0 = grid.tp_rank * h;
  const double at_check = max_over_ranks(slice_difference(g.at_check, whole_at_check, cfg.d_model, cfg.hidden, h0, h));
  const double after = max_over_ranks(slice_difference(values_of(mine.compared), whole_after, cfg.d_model, cfg.hidden, h0, h));
  // 3. The replicas: the outer layers (and the row layer's bias) the same bits on every rank, each
  // slice of the MLP the same bits on every rank of its column.
  const auto rep = dist::gather_strings(bits_hash({mine.embed->weight, mine.embed->bias, mine.out->weight, mine.out->bias,
                                                   mlp->fc2->bias}));
  const auto sliced = dist::gather_strings(bits_hash({fc1_slice.weight, fc1_slice.bias, fc2_slice.weight}));
  bool replicas_equal = true;
  for (int r = 0; r < W; ++r)
    replicas_equal = replicas_equal && rep[size_t(r)] == rep[0] && sliced[size_t(r)] == sliced[size_t(r % grid.tp_size)];

  // With clipping, each step's gradient norm: the grid's, its slices added over the row and its
  // chunks over the column, against the unsharded model's.
  double norms = 0;
  if (dist::rank() == 0)
    for (size_t s = 0; s < std::min<size_t>(g.norms.size(), kCheckedSteps); ++s)
      norms = std::max(norms, std::fabs(u.norms[s] - g.norms[s]) / std::max(std::fabs(u.norms[s]), 1e-30));
  // Under autocast (--precision bf16 / fp16) the two runs round their products to 16 bits at
  // different places (each part's GEMMs are over its own rows and columns), and float16's loss
  // scaler skips the steps whose gradients overflow, which differ with the parts' sizes: training
  // carries those differences far beyond a rounding, so there the figures are reported, not checked.
  const bool mixed = cfg.autocast != DType::f32;
  const bool equal = mixed || (first <= rtol && at_check <= rtol && norms <= rtol);  // rank 0's verdict on the losses, everyone's on the tensors
  const int checked = static_cast<int>(std::min<int64_t>(kCheckedSteps, steps));
  std::printf("grid check: %d dp x %d tp over %d process%s %s the unsharded run within rounding over the first %d steps "
              "(largest relative difference of the losses %.1e, of every rank's tensors against their part of the "
              "unsharded ones after step %d %.1e; at most %.0e allowed)\n",
              grid.dp_size, grid.tp_size, W, W > 1 ? "es" : "",
              mixed ? "(under autocast: reported, not checked) against" : equal ? "equals" : "DIFFERS FROM", checked, first,
              checked, at_check, rtol);
  std::printf("over all %lld steps the losses differ by at most %.1e relative, and after training the tensors by %.1e "
              "(rounding's differences, compounded by training)\n",
              (long long)steps, all, after);
  if (cfg.clip_grad_norm > 0)
    std::printf("clipping: the grid's gradient norm (the slices' squares added over each tp group, the replicated tensors' "
                "once) against the unsharded model's over the first %d steps: largest relative difference %.1e (the "
                "first step's %.4f, max norm %g)\n",
                checked, norms, g.norms.empty() ? 0.0 : g.norms[0], double(cfg.clip_grad_norm));
  std::printf("replicas: %s\n", replicas_equal ? "the outer layers and the row layer's bias have the same bits on every rank, "
                                                 "each slice of the MLP on every rank of its dp group"
                                               : "DIFFER between ranks that should hold the same bits");
  // What a rank sends a step: f and g over its row; its gradients over its column.
  int64_t grad_floats = 0, tensors = 0;
  for (auto& p : mine.params()) grad_floats += p->list_data()[0].numel(), ++tensors;
  std::printf("communication in the first step on rank 0: tp group %lld allreduces, %lld bytes (f and g, 2 * %lld * %lld * 4 "
              "= %lld); dp group %lld %s, %lld bytes (4 * %lld elements%s)\n",
              (long long)g.first_step.allreduces, (long long)g.first_step.payload_bytes, (long long)g.first_part,
              (long long)cfg.d_model, (long long)(2 * g.first_part * cfg.d_model * 4), (long long)tensors,
              cfg.grid_zero_stage == 0 ? "allreduces of its gradients"
                                   : "reduce-scatters of its gradients, then as many all-gathers of the updated weights",
              (long long)(4 * grad_floats), (long long)grad_floats, grid.dp_size == 1 ? "; a group of one sends nothing" : "");
  std::fflush(stdout);
  // The optimizer state each rank holds, measured (the allocator's bytes tagged optimizer_state),
  // against what its stage keeps: SGD's one buffer of 4 bytes per element of the P_r elements the
  // rank holds, replicated (stage 0) or its chunk over the dp group, floor(P_r (j+1) / dp) - floor(P_r j / dp).
  int64_t held = 0;
  for (auto& p : mine.params()) held += p->list_data()[0].numel();
  const int64_t chunk = cfg.grid_zero_stage == 0 ? held
                                                 : dist::chunk_begin(held, grid.dp_rank + 1, grid.dp) - dist::chunk_begin(held, grid.dp_rank, grid.dp);
  const auto measured = dist::gather_strings(std::to_string(g.state_bytes) + " " + std::to_string(4 * chunk) + " " +
                                             std::to_string(4 * held));
  bool state_as_model = true;
  std::printf("optimizer state per rank (--grid-zero-stage %d: %s), measured against the model:\n", cfg.grid_zero_stage,
              cfg.grid_zero_stage == 0 ? "replicated over each dp group" : "sharded over each dp group, ZeRO on the dp group");
  for (int r = 0; r < W; ++r) {
    long long got = 0, want = 0, whole_state = 0;
    std::sscanf(measured[size_t(r)].c_str(), "%lld %lld %lld", &got, &want, &whole_state);
    state_as_model = state_as_model && got == want;
    std::printf("  rank %d: %lld bytes (model %lld; replicated %lld)%s\n", r, got, want, whole_state, got == want ? "" : "  DIFFERS");
  }
  // Every rank's verdict, so that every rank exits with the same code.
  const bool ok = (dist::rank() != 0 || equal) && (mixed || at_check <= rtol) && replicas_equal && state_as_model;
  return dist::sum_over_ranks({ok ? 0.0 : 1.0})[0] > 0 ? 1 : 0;
}

}  // namespace d2l::sharding
