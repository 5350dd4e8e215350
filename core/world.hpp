// The world a process belongs to, as its launcher (mpirun) describes it in the environment: read at
// the bottom, because the runtime shares the host's cores among the processes on it before any
// process group (core/dist/process_group.hpp) exists.
#pragma once

namespace d2l::dist {

struct World {
  int rank = 0, size = 1;              // this process among all of them
  int local_rank = 0, local_size = 1;  // among the processes on this host
};

// The world this process belongs to, from mpirun's environment (OMPI_COMM_WORLD_*, or PMI_*),
// read once. A world of one when no launcher started it.
const World& world();
inline int rank() { return world().rank; }
inline int world_size() { return world().size; }

}  // namespace d2l::dist
