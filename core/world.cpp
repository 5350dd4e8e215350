#include "core/world.hpp"

#include <cstdlib>

namespace d2l::dist {

namespace {

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x < (1 << 24)) ? static_cast<int>(x) : fallback;
}

World read_world() {
  World w;
  // Open MPI's mpirun; MPICH and Intel MPI's launchers set PMI_*.
  w.size = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", 1));
  w.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", 0));
  w.local_rank = env_int("OMPI_COMM_WORLD_LOCAL_RANK", env_int("MPI_LOCALRANKID", w.size == 1 ? 0 : w.rank));
  w.local_size = env_int("OMPI_COMM_WORLD_LOCAL_SIZE", env_int("MPI_LOCALNRANKS", w.size));
  if (w.size < 1 || w.rank >= w.size) w = World{};
  if (w.local_size < 1 || w.local_rank >= w.local_size) w.local_rank = 0, w.local_size = 1;
  return w;
}

}  // namespace

const World& world() {
  static const World w = read_world();
  return w;
}

}  // namespace d2l::dist
