// One run at a time per run directory (RELIABILITY.md row 19): an flock(2) on RUN/.lock, held for
// the life of the process that owns the run and released by the kernel however it ends, so a
// crash never leaves a stale lock. The lock file names its holder (host, pid, start time, job).
#pragma once

#include <string>

namespace tessera {

class RunLock {
 public:
  // Takes the lock of `run_dir` (created if missing) for the job `job`: processes presenting the
  // same non-empty job identity share it (the agents of one multi-node job, or the ranks of one
  // job started without an agent); an empty `job` is this process alone. Throws ConfigError
  // (exit 2) naming the holder when another job holds it, and changes nothing on disk then.
  // On NFS, flock is carried by the server's byte-range locks (Linux >= 2.6.12).
  RunLock(const std::string& run_dir, const std::string& job);
  ~RunLock();
  RunLock(const RunLock&) = delete;
  RunLock& operator=(const RunLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace tessera
