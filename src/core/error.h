// Layer core: errors and exit codes, CHECK, logging, the start-up arena, the counter-based RNG,
// threads, file I/O, fault injection. It knows no other layer.
//
// Error hierarchy and exit codes: the contract between a worker, its agent and the user.
#pragma once

#include <stdexcept>
#include <string>

namespace tessera {

// Process exit codes. 2 to 4 are never restarted; 10 and above a restart can cure.
enum ExitCode : int {
  kExitOk = 0,
  kExitFailure = 1,     // unexpected internal error (a bug)
  kExitConfig = 2,      // bad command line or configuration
  kExitData = 3,        // bad input data (corrupt shard, wrong tokenizer, ...)
  kExitHealth = 4,      // the health check before step 0 failed on some rank (a broken machine
                        // or network: a restart on the same hardware would fail again)
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

// The health check before step 0 failed; the message names the failing rank(s) and checks.
class HealthError : public Error {
 public:
  explicit HealthError(const std::string& what) : Error(what, kExitHealth) {}
};

class NonFiniteError : public Error {
 public:
  explicit NonFiniteError(const std::string& what) : Error(what, kExitNonFinite) {}
};

}  // namespace tessera
