// Key-value store for rendezvous (ARCHITECTURE.md, Launcher): set, get, add, wait with timeouts.
// Every key lives under a job token and a round prefix, so a restarted round never reads the
// keys of an earlier one and a process of another job is refused.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tessera::dist {

using Bytes = std::vector<uint8_t>;
using Millis = std::chrono::milliseconds;

class Store {
 public:
  virtual ~Store() = default;
  // Sets key to value (last writer wins).
  virtual void set(const std::string& key, const Bytes& value) = 0;
  // The key's value, waiting for it up to `timeout`; throws StoreError naming the key on timeout.
  virtual Bytes get(const std::string& key, Millis timeout) = 0;
  // Atomically adds delta to the integer at key (0 when absent) and returns the new value.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists; throws StoreError naming the missing keys on timeout.
  virtual void wait(const std::vector<std::string>& keys, Millis timeout) = 0;
  // Whether every key exists now.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // The keys of this round that start with `prefix` ("" for all), sorted bytewise. With leased
  // keys (EtcdStore::set_with_lease) this answers "which agents are alive".
  virtual std::vector<std::string> list(const std::string& prefix) = 0;
};

// A store in a directory of a local (or shared) file system: one file per key under
// DIR/<job token>/<round>/, written to a temporary name and renamed, so readers never see a
// partial value; add() is serialized with flock(2) and stores the integer as decimal text.
// Opening checks DIR/token, which the first process writes: a process with another token for the
// same directory is refused with a StoreError. Token and round must match [A-Za-z0-9_.-]+.
std::unique_ptr<Store> make_file_store(const std::string& dir, const std::string& job_token, const std::string& round);

}  // namespace tessera::dist
