// One seed, the same numbers on every device and for any split of the work.
#include <doctest/doctest.h>

#include "core/ops.hpp"
#include "core/rng.hpp"
#include "core/runtime.hpp"

using namespace d2l;

TEST_CASE("same seed: identical values on cpu(0) and cpu(1), for any thread budget") {
  use_devices({cpu(0)});  // cpu(0) with every core
  manual_seed(42);
  auto a = normal({1001}, 0, 1, cpu(0)).to_vector();
  use_devices({cpu(0), cpu(1)});  // now one thread each
  manual_seed(42);
  auto b = normal({1001}, 0, 1, cpu(1)).to_vector();
  CHECK(a == b);
  manual_seed(43);
  CHECK(normal({1001}, 0, 1, cpu(0)).to_vector() != a);
}

TEST_CASE("any chunking of a draw gives the same numbers") {
  manual_seed(5);
  auto whole = uniform({300}, -1, 1, cpu(0)).to_vector();
  manual_seed(5);
  std::vector<float> parts;
  for (int64_t n : {1, 99, 200}) {
    auto p = uniform({n}, -1, 1, n % 2 ? cpu(1) : cpu(0)).to_vector();  // alternate devices too
    parts.insert(parts.end(), p.begin(), p.end());
  }
  CHECK(parts == whole);
}
