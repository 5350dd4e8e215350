// Process groups and the dp x tp grid (core/dist/group.hpp, grid.hpp), run as 1, 2 and 4 processes
// (mpirun.sh):
//   groups     split() by color and key: the members and their order against the colors every rank
//              gave; a group's communicator really holds those ranks (a one-hot allreduce over it)
//   grid       the layout for W = 1, 2, 4 and tp = 1, 2, 4 against the definition (tp groups of
//              consecutive ranks, dp groups of equal tp rank); the groups Grid makes in this world
//              against that layout; tp not dividing W: one CollectiveError line naming --tp-size
//   allreduce  over a group (library, ring, naive) and sum_over_ranks: rank r adds 2^r, so every
//              subset of ranks has its own sum and a world sum would be a different number
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "check.hpp"
#include "core/dist/collectives.hpp"
#include "core/dist/grid.hpp"
#include "core/dist/process_group.hpp"
#include "core/ops.hpp"
#include "core/runtime.hpp"

using namespace d2l;

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
