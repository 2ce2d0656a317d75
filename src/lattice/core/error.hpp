// Errors: the one exception type Lattice throws for bad input or impossible requests, and check
// helpers.
#pragma once

#include <stdexcept>
#include <string>

namespace lattice {

// Thrown for anything a user can fix (bad config, impossible layout, corrupt file). The message is
// one line that names the problem and the fix; the CLI prints it as "error: <message>" and exits
// non-zero.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

// Throws Error(message) when condition is false.
inline void check(bool condition, const std::string& message) {
  if (!condition) throw Error(message);
}

}  // namespace lattice
