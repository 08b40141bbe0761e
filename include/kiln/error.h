#pragma once
// Errors are values thrown as kiln::Error with their context (file, key, tensor) already
// in the message; the CLI catches once, prints one line, and exits non-zero.
#include <stdexcept>
#include <string>

namespace kiln {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The user asked for something that cannot work (bad option value, missing argument):
// the CLI maps it to exit code 2 instead of 1.
class UsageError : public Error {
 public:
  using Error::Error;
};

}  // namespace kiln
