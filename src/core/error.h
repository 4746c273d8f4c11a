// Error hierarchy and exit codes: the contract between a worker, its agent and the user.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Process exit codes. 2 and 3 are never restarted; 10 and above a restart can cure.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // unexpected internal error (a bug)
  kExitConfig = 2,      // bad command line or configuration
  kExitData = 3,        // bad input data (corrupt shard, wrong tokenizer, ...)
  kExitIo = 10,         // I/O error (checkpoint write, disk full)
  kExitNonFinite = 11,  // loss or gradient norm not finite
  kExitPeer = 12,       // lost peer or collective timeout
};

// Base of every recoverable fault. The message names the key, file, tensor or rank at fault.
class Error : public std::runtime_error {
 public:
  Error(const std::string& what, ExitCode code) : std::runtime_error(what), code_(code) {}
  ExitCode exit_code() const { return code_; }

 private:
  ExitCode code_;
};

class ConfigError : public Error {
 public:
  explicit ConfigError(const std::string& what) : Error(what, kExitConfig) {}
};

class DataError : public Error {
 public:
  explicit DataError(const std::string& what) : Error(what, kExitData) {}
};

class IoError : public Error {
 public:
  explicit IoError(const std::string& what) : Error(what, kExitIo) {}
};

class NonFiniteError : public Error {
 public:
  explicit NonFiniteError(const std::string& what) : Error(what, kExitNonFinite) {}
};

}  // namespace tessera
