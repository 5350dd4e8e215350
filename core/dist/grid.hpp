// The grid of data and tensor parallelism over processes (Megatron-LM's model-parallel groups, as
// picotron lays them out): the W ranks of the world arranged as dp x tp, tp of them per
// tensor-parallel group and dp = W / tp groups. Read the world ranks as a (dp, tp) matrix, row-major:
//
//   W = 4, tp = 2:        tp rank 0   tp rank 1
//          dp rank 0   [  rank 0      rank 1   ]   <- tp group [0, 1]: one copy of the model, its
//          dp rank 1   [  rank 2      rank 3   ]      weights split over the row
//                           ^ dp group [0, 2]: the ranks holding the same slice of the weights
//
//   a tp group is a row: tp consecutive ranks, which split one model's weights between them (their
//     f and g sum over the row) and take the same shard of the minibatch;
//   a dp group is a column: the ranks with the same tp rank, holding the same slice of the weights
//     on different shards of the minibatch; their gradients are averaged over the column.
// Consecutive ranks for tensor parallelism because its two allreduces per layer are the most frequent
// messages: on machines of several GPUs, the ranks of one row share a machine's fast links.
#pragma once
#include <string>
#include <vector>

#include "core/dist/group.hpp"

namespace d2l::dist {

// Where world rank `rank` sits in a grid of `world` ranks with `tp_size` ranks per row: plain
// arithmetic, no MPI (the layout Grid builds, and what tests compare it with).
struct GridPlace {
  int rank = 0, dp_rank = 0, tp_rank = 0;
  std::vector<int> tp_members, dp_members;  // world ranks of its row and of its column
};
GridPlace grid_place(int world, int tp_size, int rank);

// tp_size must be >= 1 and divide the world: otherwise a CollectiveError naming `flag` (every rank
// finds the same, rank 0 says it in one line, every rank exits 2).
void check_grid(int world, int tp_size, const std::string& flag = "--tp-size");

class Grid {
 public:
  // Checks tp_size (check_grid), then makes this rank's two groups: a collective over the world.
  explicit Grid(int tp_size, const std::string& flag = "--tp-size");

  int tp_size = 1, dp_size = 1;
  int tp_rank = 0, dp_rank = 0;
  Group tp, dp;  // this rank's row and column

  // This rank's line of the mapping: "rank 2: dp rank 1, tp rank 0; tp group [2, 3], dp group [0, 2]".
  std::string describe() const;
};

// Every rank's describe() in rank order (a collective over the world).
std::vector<std::string> describe_all(const Grid& grid);

}  // namespace d2l::dist
