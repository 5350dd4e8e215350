// The tests' check of a refusal: `make()` must throw an E whose message is one line naming `expected`
// (the project's rule for bad input: a clear one-line error).
#pragma once
#include <doctest/doctest.h>

#include <exception>
#include <string>

namespace d2l::test {

template <class E = std::exception, class F>
void check_one_line_error(F&& make, const std::string& expected) {
  try {
    make();
    FAIL("no error: " << expected);
  } catch (const E& e) {
    const std::string what = e.what();
    CHECK(what.find('\n') == std::string::npos);
    CHECK_MESSAGE(what.find(expected) != std::string::npos, what);
  }
}

}  // namespace d2l::test
