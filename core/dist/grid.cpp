#include "core/dist/grid.hpp"

#include "core/dist/collectives.hpp"
#include "core/dist/process_group.hpp"

namespace d2l::dist {

GridPlace grid_place(int world, int tp_size, int rank) {
  GridPlace p;
  p.rank = rank;
  p.dp_rank = rank / tp_size;  // the row
  p.tp_rank = rank % tp_size;  // the column
  for (int t = 0; t < tp_size; ++t) p.tp_members.push_back(p.dp_rank * tp_size + t);
  for (int d = 0; d < world / tp_size; ++d) p.dp_members.push_back(d * tp_size + p.tp_rank);
  return p;
}

void check_grid(int world, int tp_size, const std::string& flag) {
  if (tp_size < 1)
    throw CollectiveError("bad " + flag + " " + std::to_string(tp_size) +
                          ": expected a positive number of processes per tensor-parallel group");
  if (world % tp_size != 0) {
    std::string why = "bad " + flag + " " + std::to_string(tp_size) + ": it must divide the " + std::to_string(world) +
                      (world == 1 ? " process" : " processes");
    if (world == 1) why += " (start a multiple of " + std::to_string(tp_size) + " processes: mpirun -np N)";
    throw CollectiveError(why);
  }
}

Grid::Grid(int tp_size_, const std::string& flag) {
  const int W = world_size();
  check_grid(W, tp_size_, flag);
  tp_size = tp_size_;
  dp_size = W / tp_size;
  const GridPlace p = grid_place(W, tp_size, rank());
  tp_rank = p.tp_rank;
  dp_rank = p.dp_rank;
  // A row: the ranks of one dp rank, ordered by world rank (so the group rank is the tp rank).
  tp = split(dp_rank, rank());
  // A column: the ranks of one tp rank (group rank = dp rank).
  dp = split(tp_rank, rank());
}

std::string Grid::describe() const {
  return "rank " + std::to_string(rank()) + ": dp rank " + std::to_string(dp_rank) + ", tp rank " +
         std::to_string(tp_rank) + "; tp group " + tp.str() + ", dp group " + dp.str();
}

std::vector<std::string> describe_all(const Grid& grid) { return gather_strings(grid.describe()); }

}  // namespace d2l::dist
