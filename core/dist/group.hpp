// Process groups: a subset of the world's ranks that runs its own collectives (an MPI
// sub-communicator, MPI_Comm_split). Data parallelism sums gradients over every rank of the world;
// once the ranks are also split for tensor parallelism (core/dist/grid.hpp), each sum runs over a
// group: the ranks holding the same slice of the weights, or the ranks sharing one minibatch shard.
//
// A group has its own ranks 0..size-1, in the order of the key each member gave (by default its
// world rank), and knows which world ranks it holds. The world itself is a group (Group(), the
// default of every collective that takes one). In a world of one (no mpirun) every group is the
// group of one, {0}, and no MPI is involved. Making a group is a collective over the whole world:
// every rank calls split() at the same point of the program, as for any collective.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace d2l::dist {

class Group {
 public:
  Group();  // the world: every rank, group rank = world rank
  // This process alone: a group of one, whose collectives never ask MPI (not a collective to make).
  static Group self();

  int rank() const { return rank_; }                          // this process's place in the group
  int size() const { return static_cast<int>(ranks_.size()); }
  const std::vector<int>& ranks() const { return ranks_; }    // member i's world rank
  bool is_world() const { return world_; }
  std::string str() const;                                    // the members' world ranks, "[0, 2]"

  // The MPI communicator (an MPI_Comm*, opaque so that this header needs no mpi.h), for the
  // collectives of core/dist; null in a world of one.
  const void* native() const { return comm_.get(); }

 private:
  friend Group split(int color, int key);
  int rank_ = 0;
  std::vector<int> ranks_;
  bool world_ = true;
  std::shared_ptr<const void> comm_;
};

// MPI_Comm_split of the world: the ranks that pass the same color (>= 0) form one group, ordered by
// key (ties by world rank). Every rank of the world calls it, at the same point of the program.
Group split(int color, int key);
inline Group split(int color) { return split(color, -1); }  // key -1: the world rank

}  // namespace d2l::dist
