#include "core/dist/group.hpp"

#include "core/device.hpp"
#include "core/dist/process_group.hpp"

#ifdef D2L_WITH_MPI
#include <mpi.h>
#endif

namespace d2l::dist {

namespace {

// The world's communicator, made once (null in a world of one or a build without MPI).
std::shared_ptr<const void> world_comm() {
#ifdef D2L_WITH_MPI
  static const std::shared_ptr<const void> c =
      world_size() > 1 ? std::make_shared<const MPI_Comm>(MPI_COMM_WORLD) : nullptr;
  return c;
#else
  return nullptr;
#endif
}

std::vector<int> zero_to(int n) {
  std::vector<int> v(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  return v;
}

}  // namespace

Group::Group() : rank_(dist::rank()), ranks_(zero_to(world_size())), world_(true), comm_(world_comm()) {}

Group Group::self() {
  Group g;
  g.rank_ = 0;
  g.ranks_ = {dist::rank()};
  g.world_ = world_size() == 1;
  g.comm_ = nullptr;
  return g;
}

std::string Group::str() const {
  std::string s = "[";
  for (size_t i = 0; i < ranks_.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks_[i]);
  return s + "]";
}

Group split(int color, int key) {
  if (color < 0) throw ConfigError("dist::split: color " + std::to_string(color) + " must be >= 0");
  if (key < 0) key = rank();
  Group g;
  g.world_ = false;
  g.comm_ = nullptr;
  if (world_size() == 1) {  // the group of one: nothing to ask MPI
    g.rank_ = 0;
    g.ranks_ = {0};
    return g;
  }
#ifdef D2L_WITH_MPI
  init();
  auto handle = std::make_shared<MPI_Comm>(MPI_COMM_NULL);
  std::vector<int> members;
  int my_rank = 0;
  comm().enqueue("MPI_Comm_split", [&] {
    // MPI_Comm_split blocks; a barrier first (polled, so an abort still ends the wait) makes every
    // rank arrive before any enters it.
    MPI_Request q;
    MPI_Ibarrier(MPI_COMM_WORLD, &q);
    wait_request(&q);
    MPI_Comm_split(MPI_COMM_WORLD, color, key, handle.get());
    int n = 0;
    MPI_Comm_size(*handle, &n);
    MPI_Comm_rank(*handle, &my_rank);
    // Which world rank each member is: every member tells the others its own.
    members.resize(static_cast<size_t>(n));
    const int me = rank();
    MPI_Iallgather(&me, 1, MPI_INT, members.data(), 1, MPI_INT, *handle, &q);
    wait_request(&q);
  });
  comm().synchronize();
  g.rank_ = my_rank;
  g.ranks_ = members;
  // The communicator is kept until MPI_Finalize, which releases it with the others.
  g.comm_ = handle;
#else
  (void)key;
#endif
  return g;
}

}  // namespace d2l::dist
