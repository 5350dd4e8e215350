// Process groups and the dp x tp grid (core/dist/group.hpp, grid.hpp), and tensor parallelism over
// the ranks of a group (core/tensor_parallel), run as 1, 2 and 4 processes (mpirun.sh):
//   groups     split() by color and key: the members and their order against the colors every rank
//              gave; a group's communicator really holds those ranks (a one-hot allreduce over it)
//   grid       the layout for W = 1, 2, 4 and tp = 1, 2, 4 against the definition (tp groups of
//              consecutive ranks, dp groups of equal tp rank); the groups Grid makes in this world
//              against that layout; tp not dividing W: one CollectiveError line naming --tp-size
//   allreduce  over a group (library, ring, naive) and sum_over_ranks: rank r adds 2^r, so every
//              subset of ranks has its own sum and a world sum would be a different number
//   f, g       over a tp group of 2 ranks (1 in a world of one or three): f's backward and g's
//              against central differences of the logical loss; without f the check fails
//   MLP        shard_mlp over the tp group against the unsharded MLP on each rank: outputs, input
//              gradients, this rank's slice of the weight gradients and of the weights over 10 SGD
//              steps; the bytes f and g send; parameter names and descriptions; errors
//   groups'    all-gather, reduce-scatter and broadcast over a group against what its members gave;
//   ZeRO       a Trainer on the grid (SGD with momentum, ZeRO-0, 1 and 2 over the dp group, clipping
//              over the tp slices) against one process on the whole batch: the weights, every step's
//              gradient norm, and the momentum bytes each rank holds (the allocator's) against its chunk
//   checkpoint sharded checkpoints on the grid: a file set per tp slice over its dp group, resumed bit
//              for bit; a slice's file missing, or slices of two saves, one ConfigError on every rank
#include <doctest/doctest.h>

#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/autograd.hpp"
#include "core/checkpoint/sharded_checkpoint.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/grid.hpp"
#include "core/dist/process_group.hpp"
#include "core/allocator.hpp"
#include "core/nn/dense.hpp"
#include "core/ops.hpp"
#include "core/optim/trainer.hpp"
#include "core/runtime.hpp"
#include "core/tensor_parallel/conjugate_ops.hpp"
#include "core/tensor_parallel/megatron_mlp.hpp"
#include "fd_check.hpp"
#include "reference_mlp.hpp"

using namespace d2l;
using namespace d2l::test::reference_mlp;
using d2l::test::close;
using d2l::test::lcg_data;

namespace {

// The world ranks whose color equals `color`, in world-rank order: what split(color) must hold.
std::vector<int> ranks_with(const std::vector<int>& colors, int color) {
  std::vector<int> v;
  for (size_t r = 0; r < colors.size(); ++r)
    if (colors[r] == color) v.push_back(static_cast<int>(r));
  return v;
}

// Which world ranks an allreduce over `g` reaches: each member adds a one at its world rank.
std::vector<float> members_by_allreduce(const dist::Group& g) {
  std::vector<float> onehot(static_cast<size_t>(dist::world_size()), 0.0f);
  onehot[static_cast<size_t>(dist::rank())] = 1.0f;
  Tensor t = Tensor::from_vector(onehot, {dist::world_size()}, cpu(0));
  dist::allreduce(t, g);
  return t.to_vector();
}
std::vector<float> indicator(const std::vector<int>& ranks) {
  std::vector<float> v(static_cast<size_t>(dist::world_size()), 0.0f);
  for (int r : ranks) v[static_cast<size_t>(r)] = 1.0f;
  return v;
}

// The tensor-parallel group of the tests: 2 ranks when the world is even, else the group of one.
int tp_for_world() { return dist::world_size() % 2 == 0 ? 2 : 1; }

// The grid of the tests with a tp group (tp_for_world), this rank on its cpu(0).
dist::Grid tp_grid() {
  use_devices({cpu(0)});
  return dist::Grid(tp_for_world());
}

// A smooth scalar of y: sum(sigmoid(y) * r).
Tensor smooth_loss(const Tensor& y, const std::vector<float>& r) {
  return sum(mul(sigmoid(y), Tensor::from_vector(r, y.shape(), y.device())));
}
constexpr double kH = 1e-2, kAtol = 2e-3, kRtol = 2e-2;  // test::gradcheck's tolerances
const Shape kShape{2, 3};
std::vector<float> r_of(int t) { return lcg_data(6, 10 + static_cast<uint32_t>(t)); }
std::vector<float> z_of(int t) { return lcg_data(6, 30 + static_cast<uint32_t>(t)); }

// ---- The MLP: the unsharded reference on this rank's cpu(0) (tests/reference_mlp.hpp), with weights
// from lcg_data too (the same on every rank, whatever the RNG).
struct Reference : test::reference_mlp::ReferenceMlp {
  Reference() : ReferenceMlp(Init::Zero(), 2, 4) {
    fc1.weight->set_data(Tensor::from_vector(lcg_data(kHidden * kModel, 1), {kHidden, kModel}, cpu(0)));
    fc2.weight->set_data(Tensor::from_vector(lcg_data(kModel * kHidden, 3), {kModel, kHidden}, cpu(0)));
  }
};

// Rows [r0, r0 + rows) of a row-major matrix with C columns; columns [c0, c0 + cols) of one.
std::vector<float> rows_of(const std::vector<float>& m, int64_t C, int64_t r0, int64_t rows) {
  return {m.begin() + r0 * C, m.begin() + (r0 + rows) * C};
}
std::vector<float> cols_of(const std::vector<float>& m, int64_t C, int64_t c0, int64_t cols) {
  std::vector<float> out;
  for (size_t r = 0; r < m.size() / static_cast<size_t>(C); ++r)
    out.insert(out.end(), m.begin() + static_cast<int64_t>(r) * C + c0, m.begin() + static_cast<int64_t>(r) * C + c0 + cols);
  return out;
}

// This rank's shard against its slice of the reference: weights, or gradients.
bool shard_matches(const Reference& ref, const tp::MegatronMLP& mlp, int t, int P, bool grads, const std::string& when) {
  auto v = [&](const nn::ParameterPtr& p) { return (grads ? p->grad(cpu(0)) : p->data(cpu(0))).to_vector(); };
  const int64_t h = kHidden / P;
  const std::string what = when + (grads ? " gradient of " : " ");
  bool ok = close(rows_of(v(ref.fc1.weight), kModel, t * h, h), v(mlp.fc1->shards()[0]->weight), kMlpAtol, kMlpRtol,
                  (what + "fc1.weight").c_str());
  ok = close(rows_of(v(ref.fc1.bias), 1, t * h, h), v(mlp.fc1->shards()[0]->bias), kMlpAtol, kMlpRtol,
             (what + "fc1.bias").c_str()) && ok;
  ok = close(cols_of(v(ref.fc2.weight), kHidden, t * h, h), v(mlp.fc2->shards()[0]->weight), kMlpAtol, kMlpRtol,
             (what + "fc2.weight").c_str()) && ok;
  ok = close(v(ref.fc2.bias), v(mlp.fc2->bias), kMlpAtol, kMlpRtol, (what + "fc2.bias").c_str()) && ok;
  return ok;
}

void sgd_step(const nn::ParameterDict& params) {
  NoGrad no_grad;
  for (auto& p : params.trainable()) {
    auto ws = p->list_data(), gs = p->list_grad();
    for (size_t k = 0; k < ws.size(); ++k) sgd_update_(ws[k], gs[k], kLr);
    p->zero_grad();
  }
}

}  // namespace

TEST_CASE("groups: split by color and key holds the ranks of that color, in key order") {
  use_devices({cpu(0)});
  const int W = dist::world_size(), r = dist::rank();
  // Colors by parity, by halves, and one color for all: the members are the ranks of the same color.
  for (int scheme = 0; scheme < 3; ++scheme) {
    CAPTURE(scheme);
    std::vector<int> colors(static_cast<size_t>(W));
    for (int q = 0; q < W; ++q) colors[static_cast<size_t>(q)] = scheme == 0 ? q % 2 : scheme == 1 ? (2 * q) / W : 0;
    const int mine = colors[static_cast<size_t>(r)];
    dist::Group g = dist::split(mine);
    const std::vector<int> want = ranks_with(colors, mine);
    CHECK(g.ranks() == want);
    CHECK(g.size() == static_cast<int>(want.size()));
    CHECK(g.ranks()[static_cast<size_t>(g.rank())] == r);
    CHECK_FALSE(g.is_world());
    CHECK(members_by_allreduce(g) == indicator(want));
  }
  // A key in reverse order of the world ranks: group rank 0 is the last world rank.
  dist::Group rev = dist::split(0, W - 1 - r);
  CHECK(rev.rank() == W - 1 - r);
  CHECK(rev.ranks().front() == W - 1);
  CHECK(rev.ranks().back() == 0);
  // The world as a group.
  dist::Group world;
  CHECK(world.is_world());
  CHECK(world.size() == W);
  CHECK(world.rank() == r);
  CHECK(members_by_allreduce(world) == std::vector<float>(static_cast<size_t>(W), 1.0f));
  CHECK_THROWS_AS(dist::split(-1), ConfigError);
}

TEST_CASE("grid layout for W = 1, 2, 4 and tp = 1, 2, 4: rows of consecutive ranks, columns of equal tp rank") {
  // The 2 x 2 grid written out.
  const dist::GridPlace p2 = dist::grid_place(4, 2, 2);
  CHECK(p2.dp_rank == 1);
  CHECK(p2.tp_rank == 0);
  CHECK(p2.tp_members == std::vector<int>{2, 3});
  CHECK(p2.dp_members == std::vector<int>{0, 2});
  // Every case, against the definition.
  for (int W : {1, 2, 4})
    for (int tp : {1, 2, 4}) {
      if (W % tp != 0) continue;
      CAPTURE(W);
      CAPTURE(tp);
      std::vector<int> seen_in_tp(static_cast<size_t>(W), 0);
      for (int r = 0; r < W; ++r) {
        CAPTURE(r);
        const dist::GridPlace p = dist::grid_place(W, tp, r);
        CHECK(p.dp_rank * tp + p.tp_rank == r);
        REQUIRE(static_cast<int>(p.tp_members.size()) == tp);
        REQUIRE(static_cast<int>(p.dp_members.size()) == W / tp);
        for (int i = 0; i < tp; ++i) CHECK(p.tp_members[static_cast<size_t>(i)] == r - r % tp + i);  // consecutive
        for (int j = 0; j < W / tp; ++j) {
          const int q = p.dp_members[static_cast<size_t>(j)];
          CHECK(q % tp == r % tp);  // the same tp rank: the same slice of the weights
          CHECK(q / tp == j);       // in dp rank order
        }
        CHECK(p.tp_members[static_cast<size_t>(p.tp_rank)] == r);
        CHECK(p.dp_members[static_cast<size_t>(p.dp_rank)] == r);
        if (p.tp_rank == 0)
          for (int q : p.tp_members) seen_in_tp[static_cast<size_t>(q)]++;
      }
      for (int c : seen_in_tp) CHECK(c == 1);  // the rows partition the world
    }
}

TEST_CASE("Grid in this world: its groups are the layout's, and their communicators hold those ranks") {
  use_devices({cpu(0)});
  const int W = dist::world_size(), r = dist::rank();
  for (int tp : {1, 2, 4}) {
    if (W % tp != 0) continue;
    CAPTURE(tp);
    dist::Grid grid(tp);
    const dist::GridPlace p = dist::grid_place(W, tp, r);
    CHECK(grid.tp_size == tp);
    CHECK(grid.dp_size == W / tp);
    CHECK(grid.tp_rank == p.tp_rank);
    CHECK(grid.dp_rank == p.dp_rank);
    CHECK(grid.tp.ranks() == p.tp_members);
    CHECK(grid.dp.ranks() == p.dp_members);
    CHECK(grid.tp.rank() == p.tp_rank);
    CHECK(grid.dp.rank() == p.dp_rank);
    CHECK(members_by_allreduce(grid.tp) == indicator(p.tp_members));
    CHECK(members_by_allreduce(grid.dp) == indicator(p.dp_members));
    // The mapping every rank prints: one line per rank, in rank order.
    const auto lines = dist::describe_all(grid);
    REQUIRE(static_cast<int>(lines.size()) == W);
    for (int q = 0; q < W; ++q) {
      const dist::GridPlace pq = dist::grid_place(W, tp, q);
      auto list = [](const std::vector<int>& v) {
        std::string s;
        for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
        return "[" + s + "]";
      };
      CHECK(lines[static_cast<size_t>(q)] == "rank " + std::to_string(q) + ": dp rank " + std::to_string(pq.dp_rank) +
                                                  ", tp rank " + std::to_string(pq.tp_rank) + "; tp group " +
                                                  list(pq.tp_members) + ", dp group " + list(pq.dp_members));
    }
  }
}

TEST_CASE("grid: a tp size that does not divide the world is one CollectiveError line naming the flag") {
  const int W = dist::world_size();
  for (int tp : {0, -2, 3, 2 * W + 1, W + 1}) {
    CAPTURE(tp);
    if (tp >= 1 && W % tp == 0) continue;
    CHECK_THROWS_AS(dist::check_grid(W, tp), dist::CollectiveError);
    CHECK_THROWS_AS(dist::Grid{tp}, dist::CollectiveError);
  }
  CHECK_THROWS_WITH_AS(dist::check_grid(4, 3), "bad --tp-size 3: it must divide the 4 processes", dist::CollectiveError);
  CHECK_THROWS_WITH_AS(dist::check_grid(1, 2, "--tp"),
                       "bad --tp 2: it must divide the 1 process (start a multiple of 2 processes: mpirun -np N)",
                       dist::CollectiveError);
  CHECK_NOTHROW(dist::check_grid(6, 3));
}

TEST_CASE("allreduce over a group sums that group's ranks only (library, ring, naive), sum_over_ranks too") {
  use_devices({cpu(0)});
  const int W = dist::world_size(), r = dist::rank();
  for (int tp : {1, 2, 4}) {
    if (W % tp != 0) continue;
    dist::Grid grid(tp);
    for (const dist::Group* g : {&grid.tp, &grid.dp}) {
      // Rank q adds 2^q (times a pattern over the elements): each subset of ranks has its own sum.
      double want = 0, world_sum = 0;
      for (int q : g->ranks()) want += std::ldexp(1.0, q);
      for (int q = 0; q < W; ++q) world_sum += std::ldexp(1.0, q);
      CAPTURE(tp);
      CAPTURE(g->str());
      if (g->size() < W) CHECK(want != world_sum);
      for (const char* algo : {"library", "ring", "naive"})
        for (int64_t n : {1, 7, 1000}) {
          CAPTURE(algo);
          CAPTURE(n);
          std::vector<float> v(static_cast<size_t>(n));
          for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = static_cast<float>(std::ldexp(1.0, r) * (1 + i % 5));
          Tensor t = Tensor::from_vector(v, {n}, cpu(0));
          dist::allreduce(t, *g, algo);
          const auto got = t.to_vector();
          bool exact = true;
          for (int64_t i = 0; i < n; ++i) exact = exact && got[static_cast<size_t>(i)] == static_cast<float>(want * (1 + i % 5));
          CHECK(exact);
        }
      const auto s = dist::sum_over_ranks({std::ldexp(1.0, r), 1.0}, *g);
      CHECK(s[0] == want);
      CHECK(s[1] == g->size());
      dist::barrier(*g);
    }
  }
}

TEST_CASE("all-gather, reduce-scatter and broadcast over a group: the group's ranks only, its chunks, its bytes") {
  use_devices({cpu(0)});
  const int W = dist::world_size(), r = dist::rank();
  for (int tp : {1, 2}) {
    if (W % tp != 0) continue;
    dist::Grid grid(tp);
    for (const dist::Group* g : {&grid.tp, &grid.dp}) {
      CAPTURE(tp);
      CAPTURE(g->str());
      const int G = g->size(), me = g->rank();
      for (int64_t n : {1, 7, 1000}) {
        CAPTURE(n);
        // Rank q's input element i is 2^q (1 + i % 5): a sum names the ranks it added.
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[size_t(i)] = static_cast<float>(std::ldexp(1.0, r) * (1 + i % 5));
        const int64_t lo = n * me / G, hi = n * (me + 1) / G;  // this member's chunk: [n me / G, n (me+1) / G)
        std::vector<int64_t> counts;
        for (int q = 0; q < G; ++q) counts.push_back(n * (q + 1) / G - n * q / G);
        double members = 0;
        for (int q : g->ranks()) members += std::ldexp(1.0, q);
        // reduce-scatter: the chunk's sum over the members, at an offset of the output.
        dist::reset_collective_counters();
        Tensor out = Tensor::zeros({hi - lo + 2}, cpu(0));
        dist::reduce_scatter_async(Tensor::from_vector(v, {n}, cpu(0)), out, 1, counts, *g).wait();
        const auto got = out.to_vector();
        bool exact = got.front() == 0 && got.back() == 0;
        for (int64_t i = lo; i < hi; ++i) exact = exact && got[size_t(i - lo + 1)] == static_cast<float>(members * (1 + i % 5));
        CHECK(exact);
        CHECK(dist::collective_counters().reduce_scatter.sent_bytes == (G > 1 ? 4 * (n - (hi - lo)) : 0));
        // all-gather with counts, and chunk_begin's split over the group: each member's chunk of its own input.
        Tensor whole = Tensor::zeros({n}, cpu(0)), split_whole = Tensor::zeros({n}, cpu(0));
        Tensor mine = Tensor::from_vector(std::vector<float>(v.begin() + lo, v.begin() + hi), {hi - lo}, cpu(0));
        dist::allgather_async(Tensor::from_vector(v, {n}, cpu(0)), lo, whole, counts, *g).wait();
        dist::allgather(mine, split_whole, *g);
        std::vector<float> want(static_cast<size_t>(n));
        for (int q = 0; q < G; ++q)
          for (int64_t i = n * q / G; i < n * (q + 1) / G; ++i)
            want[size_t(i)] = static_cast<float>(std::ldexp(1.0, g->ranks()[size_t(q)]) * (1 + i % 5));
        CHECK(whole.to_vector() == want);
        CHECK(split_whole.to_vector() == want);
        CHECK(dist::chunk_begin(n, me, *g) == lo);
        // broadcast from the group's last member.
        Tensor b = Tensor::from_vector(v, {n}, cpu(0));
        dist::broadcast(b, G - 1, *g);
        bool from_root = true;
        for (int64_t i = 0; i < n; ++i)
          from_root = from_root && b.to_vector()[size_t(i)] == static_cast<float>(std::ldexp(1.0, g->ranks().back()) * (1 + i % 5));
        CHECK(from_root);
      }
      CHECK_THROWS_AS(dist::broadcast(Tensor::zeros({3}, cpu(0)), G, *g), ConfigError);
      dist::barrier(*g);
    }
  }
}

namespace {

// sum((y - t)^2): a loss that adds over the examples, so the parts of a batch add up to the whole's.
Tensor sum_squared_error(const Tensor& y, const std::vector<float>& t) {
  const Tensor d = add(y, scale(Tensor::from_vector(t, y.shape(), y.device()), -1.0f));
  return sum(mul(d, d));
}

}  // namespace

TEST_CASE("Trainer on the grid: SGD with ZeRO-0/1/2 over the dp group and clipping over the tp slices equals one process") {
  dist::Grid grid = tp_grid();
  const int P = grid.tp_size, t = grid.tp_rank, D = grid.dp_size, j = grid.dp_rank;
  constexpr float kClip = 0.05f;  // below the norms of these steps: the clipping acts
  for (int stage : {0, 1, 2}) {
    CAPTURE(stage);
    // The whole batch (D parts of kBatch examples) on one process, and this rank's part of it on the grid.
    Reference ref;
    auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, grid.tp, cpu(0));
    optim::OptimizerOptions o;
    o.learning_rate = kLr, o.momentum = 0.9f, o.clip_grad_norm = kClip;
    nn::ParameterDict whole;
    for (nn::Dense* fc : {&ref.fc1, &ref.fc2})
      for (auto& [name, p] : fc->collect_params()) whole.add(std::string(fc == &ref.fc1 ? "fc1." : "fc2.") + name, p);
    optim::Trainer one(whole, "sgd", o, "device");
    auto state_held = [] { return runtime(cpu(0)).allocator->stats().held(MemoryTag::optimizer_state); };
    int64_t grid_state = 0, after_first = 0;  // the grid trainer's momentum bytes, made by its first step
    o.zero_stage = stage, o.dp_group = grid.dp, o.tp_group = grid.tp;
    optim::Trainer trainer(mlp->collect_params(), "sgd", o, "dist_sync");
    for (uint32_t step = 0; step < 5; ++step) {
      CAPTURE(step);
      const auto X = lcg_data(D * kBatch * kModel, 100 + step), T = lcg_data(D * kBatch * kModel, 200 + step);
      sum_squared_error(ref.fc2(ref.fc1(Tensor::from_vector(X, {D * kBatch, kModel}, cpu(0)))), T).backward();
      const auto part = [&](const std::vector<float>& a) {
        return std::vector<float>(a.begin() + j * kBatch * kModel, a.begin() + (j + 1) * kBatch * kModel);
      };
      sum_squared_error((*mlp)(Tensor::from_vector(part(X), {kBatch, kModel}, cpu(0))), part(T)).backward();
      one.step(D * kBatch);
      const int64_t before = state_held();
      trainer.step(D * kBatch);
      if (step == 0) grid_state = state_held() - before, after_first = state_held();
      CHECK(one.last_grad_norm() > kClip);
      CHECK(std::fabs(trainer.last_grad_norm() - one.last_grad_norm()) <= 1e-5 * one.last_grad_norm());
    }
    CHECK(shard_matches(ref, *mlp, t, P, false, "after 5 steps"));
    // The momentum buffers this rank keeps, measured: its P_r elements, or its chunk of them over the dp group.
    int64_t held = 0;
    for (auto& p : mlp->collect_params().trainable()) held += p->shape()[0] * (p->shape().size() > 1 ? p->shape()[1] : 1);
    const int64_t kept = stage == 0 ? held : held * (j + 1) / D - held * j / D;
    CHECK(grid_state == 4 * kept);
    CHECK(state_held() == after_first);  // and no more afterwards
  }
}

// Sharded checkpoints on the grid (core/checkpoint/sharded_checkpoint.hpp): tp slice t's dp group writes its
// own files into dir/tp-<t>-of-<T>. In a world of one or three (tp 1) the dp group is the world: the files
// go into dir itself.
TEST_CASE("a sharded checkpoint on the grid: a file set per tp slice over its dp group, resumed bit for bit") {
  namespace fs = std::filesystem;
  dist::Grid grid = tp_grid();
  const int T = grid.tp_size, t = grid.tp_rank, D = grid.dp_size, j = grid.dp_rank;
  int64_t pid = static_cast<int64_t>(::getpid());  // a directory every rank agrees on: rank 0's
  dist::broadcast_bytes(&pid, sizeof pid, 0);
  const fs::path dir = fs::temp_directory_path() / ("d2l_grid_checkpoint_" + std::to_string(pid));
  const fs::path other = dir.string() + "_other";
  const fs::path slice = T > 1 ? dir / ("tp-" + std::to_string(t) + "-of-" + std::to_string(T)) : dir;
  auto step = [&](tp::MegatronMLP& mlp, optim::Trainer& trainer, uint32_t s) {
    const auto X = lcg_data(D * kBatch * kModel, 300 + s), Y = lcg_data(D * kBatch * kModel, 400 + s);
    auto part = [&](const std::vector<float>& a) {
      return std::vector<float>(a.begin() + j * kBatch * kModel, a.begin() + (j + 1) * kBatch * kModel);
    };
    sum_squared_error(mlp(Tensor::from_vector(part(X), {kBatch, kModel}, cpu(0))), part(Y)).backward();
    trainer.step(D * kBatch);
  };
  auto values = [](const nn::ParameterDict& params) {
    std::vector<std::vector<float>> v;
    for (auto& p : params.trainable()) v.push_back(p->data(cpu(0)).to_vector());
    return v;
  };
  for (int stage : {0, 1, 2}) {
    CAPTURE(stage);
    optim::OptimizerOptions o;
    o.learning_rate = kLr, o.momentum = 0.9f, o.zero_stage = stage, o.dp_group = grid.dp, o.tp_group = grid.tp;
    Reference ref;
    auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, grid.tp, cpu(0));
    optim::Trainer trainer(mlp->collect_params(), "sgd", o, "dist_sync");
    for (uint32_t s = 0; s < 3; ++s) step(*mlp, trainer, s);
    io::save_sharded_checkpoint(dir.string(), *mlp, trainer, 7);
    CHECK(fs::exists(slice / ("rank-" + std::to_string(j) + "-of-" + std::to_string(D) + ".safetensors")));
    CHECK(fs::exists(slice / "index.json"));
    CHECK(fs::exists(slice / "parameters.safetensors"));
    for (uint32_t s = 3; s < 6; ++s) step(*mlp, trainer, s);
    const auto want = values(mlp->collect_params());
    const auto want_state = trainer.state_dict();

    Reference fresh_ref;  // other values: the load must replace them
    fresh_ref.fc1.weight->set_data(Tensor::from_vector(lcg_data(kHidden * kModel, 9), {kHidden, kModel}, cpu(0)));
    auto fresh = tp::shard_mlp(fresh_ref.fc1, fresh_ref.fc2, grid.tp, cpu(0));
    optim::Trainer second(fresh->collect_params(), "sgd", o, "dist_sync");
    CHECK(io::load_sharded_checkpoint(dir.string(), *fresh, second) == 7);
    for (uint32_t s = 3; s < 6; ++s) step(*fresh, second, s);
    CHECK(values(fresh->collect_params()) == want);
    const auto got_state = second.state_dict();
    CHECK(got_state.size() == want_state.size());
    for (const auto& [name, v] : want_state) {
      CAPTURE(name);
      CHECK(got_state.count(name) == 1);
      if (got_state.count(name)) CHECK(got_state.at(name).values == v.values);
    }

    // Tp slice 0's files from another save beside the others' (tp 2 only): one ConfigError on every rank.
    if (T > 1) {
      io::save_sharded_checkpoint(other.string(), *mlp, trainer, 8);
      dist::barrier();
      if (dist::rank() == 0)
        fs::copy(other / "tp-0-of-2", dir / "tp-0-of-2", fs::copy_options::overwrite_existing | fs::copy_options::recursive);
      dist::barrier();
      optim::Trainer third(fresh->collect_params(), "sgd", o, "dist_sync");
      CHECK_THROWS_WITH_AS(io::load_sharded_checkpoint(dir.string(), *fresh, third),
                           doctest::Contains("tp slices are from different saves"), ConfigError);
    }
    // A file of the last slice's last rank missing: one ConfigError on every rank, naming it.
    dist::barrier();
    const fs::path last = (T > 1 ? dir / ("tp-" + std::to_string(T - 1) + "-of-" + std::to_string(T)) : dir) /
                          ("rank-" + std::to_string(D - 1) + "-of-" + std::to_string(D) + ".safetensors");
    if (dist::rank() == 0) fs::remove(last);
    dist::barrier();
    optim::Trainer fourth(fresh->collect_params(), "sgd", o, "dist_sync");
    CHECK_THROWS_WITH_AS(io::load_sharded_checkpoint(dir.string(), *fresh, fourth),
                         doctest::Contains((last.string() + ": missing").c_str()), ConfigError);
    dist::barrier();
    if (dist::rank() == 0) fs::remove_all(dir), fs::remove_all(other);
    dist::barrier();
  }
}

TEST_CASE("Trainer: a dp_group needs a dist kvstore (stage 3 too, test_fsdp_dist.cpp), buckets the world; a tp_group's norm stages 0 to 2") {
  dist::Grid grid = tp_grid();
  Reference ref;
  optim::OptimizerOptions o;
  o.dp_group = grid.dp;
  CHECK_THROWS_AS(optim::Trainer(ref.fc1.collect_params(), "sgd", o, "device"), ConfigError);
  optim::OptimizerOptions three = o;
  three.zero_stage = 3;
  CHECK_THROWS_AS(optim::Trainer(ref.fc1.collect_params(), "sgd", three, "device"), ConfigError);
  CHECK_NOTHROW(optim::Trainer(ref.fc1.collect_params(), "sgd", three, "dist_sync"));
  optim::Trainer ok(ref.fc1.collect_params(), "sgd", o, "dist_sync");
  if (!grid.dp.is_world()) CHECK_THROWS_AS(ok.set_buckets(dist::BucketOptions{}), ConfigError);
  optim::OptimizerOptions tp_devices;
  tp_devices.tp_group = grid.tp, tp_devices.zero_stage = 1;
  CHECK_THROWS_AS(optim::Trainer(ref.fc1.collect_params(), "sgd", tp_devices, "device"), ConfigError);
}

TEST_CASE("f over a process group: backward sums the ranks' gradients (finite differences)") {
  dist::Grid grid = tp_grid();
  const int P = grid.tp_size, t = grid.tp_rank;
  const std::vector<float> x = lcg_data(6, 1);
  // Rank t of the group computes h_t(X) = smooth_loss(X, R_t); the logical loss is sum_t h_t(X).
  const test::LossFn L = [&](const std::vector<double>& xv) {
    NoGrad no_grad;
    double l = 0;
    for (int q = 0; q < P; ++q)
      l += smooth_loss(Tensor::from_vector(std::vector<float>(xv.begin(), xv.end()), kShape, cpu(0)), r_of(q)).item();
    return l;
  };
  for (bool with_f : {true, false}) {
    CAPTURE(with_f);
    Tensor xt = Tensor::from_vector(x, kShape, cpu(0)).attach_grad();
    tp::reset_traffic();
    Tensor y = with_f ? tp::copy_to_parallel_region(xt, grid.tp) : xt;
    CHECK(y.to_vector() == x);  // forward: the identity
    smooth_loss(y, r_of(t)).backward();
    const bool ok = test::fd_check(x, xt.grad().to_vector(), L, kH, kAtol, kRtol, 400, {}, "dX");
    if (with_f) {
      CHECK(ok);
      CHECK(tp::traffic().allreduces == 1);
      CHECK(tp::traffic().payload_bytes == 6 * 4);
    } else if (P > 1) {
      CHECK_FALSE(ok);  // without f a rank's gradient is only its own part of dL/dX
    }
  }
}

TEST_CASE("g over a process group: forward the group's sum, backward the identity (finite differences)") {
  dist::Grid grid = tp_grid();
  const int P = grid.tp_size, t = grid.tp_rank;
  const std::vector<float> r = lcg_data(6, 20);
  Tensor z = Tensor::from_vector(z_of(t), kShape, cpu(0)).attach_grad();
  Tensor y = tp::reduce_from_parallel_region(z, grid.tp);
  std::vector<double> want(6, 0.0);
  for (int q = 0; q < P; ++q)
    for (size_t e = 0; e < 6; ++e) want[e] += z_of(q)[e];
  CHECK(close(want, y.to_vector(), 1e-6, 1e-6, "sum"));
  // Every rank computes the one loss of its replica of Y; dL/dZ_t = dL/dY.
  smooth_loss(y, r).backward();
  const test::LossFn L = [&](const std::vector<double>& zt) {
    NoGrad no_grad;
    std::vector<float> s(6, 0.0f);
    for (int q = 0; q < P; ++q) {
      const std::vector<float> v = q == t ? std::vector<float>(zt.begin(), zt.end()) : z_of(q);
      for (size_t e = 0; e < 6; ++e) s[e] += v[e];
    }
    return smooth_loss(Tensor::from_vector(s, kShape, cpu(0)), r).item();
  };
  CHECK(test::fd_check(z_of(t), z.grad().to_vector(), L, kH, kAtol, kRtol, 400, {}, "dZ"));
}

TEST_CASE("the Megatron MLP sharded over the ranks of a tp group equals the unsharded MLP over 10 SGD steps") {
  dist::Grid grid = tp_grid();
  const int P = grid.tp_size, t = grid.tp_rank;
  Reference ref;
  auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, grid.tp, cpu(0));
  CHECK(shard_matches(ref, *mlp, t, P, false, "initial"));
  for (uint32_t step = 0; step < 10; ++step) {
    CAPTURE(step);
    const auto b = ref.forward_backward(100 + step, 200 + step);

    tp::reset_traffic();
    Tensor xs = Tensor::from_vector(b.X, {kBatch, kModel}, cpu(0)).attach_grad();
    Tensor ys = (*mlp)(xs);
    mse_loss(ys, Tensor::from_vector(b.T, {kBatch, kModel}, cpu(0))).backward();
    CHECK(close(b.y.to_vector(), ys.to_vector(), kMlpAtol, kMlpRtol, "output"));
    CHECK(close(b.x.grad().to_vector(), xs.grad().to_vector(), kMlpAtol, kMlpRtol, "input gradient"));
    CHECK(shard_matches(ref, *mlp, t, P, true, "step " + std::to_string(step)));
    // g forward and f backward: two allreduces of a (batch, d_model) tensor.
    CHECK(tp::traffic().allreduces == 2);
    CHECK(tp::traffic().payload_bytes == 2 * kBatch * kModel * 4);
    sgd_step(ref.fc1.collect_params());
    sgd_step(ref.fc2.collect_params());
    sgd_step(mlp->collect_params());
  }
  CHECK(shard_matches(ref, *mlp, t, P, false, "after 10 steps"));
}

TEST_CASE("layers over a process group: this rank's names and shapes, descriptions, errors") {
  dist::Grid grid = tp_grid();
  const int P = grid.tp_size, t = grid.tp_rank;
  Reference ref;
  auto mlp = tp::shard_mlp(ref.fc1, ref.fc2, grid.tp, cpu(0));
  std::vector<std::string> names;
  for (auto& [name, p] : mlp->collect_params()) names.push_back(name);
  const std::string s = std::to_string(t);  // the shard's name is its tp rank, as in the in-process layer
  CHECK(names == std::vector<std::string>{"fc1." + s + ".weight", "fc1." + s + ".bias", "fc2.bias", "fc2." + s + ".weight"});
  CHECK(mlp->fc1->shards()[0]->weight->shape() == Shape{kHidden / P, kModel});
  CHECK(mlp->fc2->shards()[0]->weight->shape() == Shape{kModel, kHidden / P});
  REQUIRE(mlp->fc1->group() != nullptr);
  CHECK(mlp->fc1->group()->ranks() == grid.tp.ranks());
  CHECK(mlp->fc1->describe() == "ColumnParallelDense(8 -> 16 over ranks " + grid.tp.str() + " (this rank's shard " + s +
                                    " on cpu(0)), Activation(relu))");
  CHECK(mlp->fc2->describe() == "RowParallelDense(16 -> 8 over ranks " + grid.tp.str() + " (this rank's shard " + s +
                                    " on cpu(0)))");
  // The in-process layers have no group.
  CHECK(tp::ColumnParallelDense(4, std::vector<Device>{cpu(0)}).group() == nullptr);
  // A split dimension the group does not divide (checked before any communication).
  if (P > 1) {
    CHECK_THROWS_WITH_AS(tp::ColumnParallelDense(5, grid.tp, cpu(0)),
                         ("ColumnParallelDense: units 5 cannot be split evenly over 2 ranks " + grid.tp.str() +
                          " (needs a positive multiple of 2)").c_str(),
                         ConfigError);
    CHECK_THROWS_AS(tp::RowParallelDense(4, 7, grid.tp, cpu(0)), ConfigError);
  }
  CHECK_THROWS_AS(tp::RowParallelDense(0, 8, grid.tp, cpu(0)), ConfigError);
  // One input, on the rank's device.
  use_devices({cpu(0), cpu(1)});
  CHECK_THROWS_AS(mlp->forward(Tensor::ones({2, kModel}, cpu(1))), ShapeError);
  CHECK_THROWS_AS(tp::copy_to_parallel_region(Tensor(), grid.tp), ShapeError);
}
