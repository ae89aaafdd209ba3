#pragma once
#include <stdexcept>
#include <string>

namespace nvfp4mla {

// Every user-facing failure (bad configuration, bad file, bad shape) is reported as an
// Error whose message says what was wrong and, where possible, what to change.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

}  // namespace nvfp4mla
