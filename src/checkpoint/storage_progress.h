// The progress of slow storage I/O that other ranks await, relayed across nodes through the job's
// store, for the launch agents' hang watchdogs (launch/progress.h). Outside its steps a rank may
// wait a long time for another's reads or writes: after its last step every rank for rank 0's
// verdict on the last upload, rank 0 for each node's report; before its first, every rank for the
// slowest rank's load of the checkpoint it resumes from. It moves no bytes meanwhile, and its
// node's agent cannot see another node's. So the rank that reads or uploads adds the bytes it
// moves to one counter of the job (progress_counter), and a waiter credits what that counter
// gains to its own heartbeat (io_progress::relay). Only bytes moved are published, never bytes
// relayed, so two waiters cannot keep each other alive: when all the I/O stalls, every waiter
// sees it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "comm/store.h"
#include "parallel/job.h"

namespace tessera::checkpoint {

// Where the counter lives and how often it is written and read.
struct ProgressCounter {
  comm::Store* store = nullptr;  // null: a single process, nothing to relay
  std::string key;
  comm::Millis period{1000};
};

// The job's counter for one attempt, in the uploaders' store (parallel::Distributed::tier_store),
// with progress_period's period.
ProgressCounter progress_counter(const parallel::Distributed& dist);
// Every second, or less often in a large job (every world/128 s, at most 30 s), so that the store
// sees about 128 requests a second however many ranks publish or wait.
comm::Millis progress_period(int world_size);

class PeriodicThread;  // storage_progress.cc: the thread behind each of the two below

// While alive, adds the bytes this process moves (io_progress::moved) to the counter, every period
// when they grew and once more at the end. A store that fails is logged once and no longer
// written; the I/O goes on.
class PublishedProgress {
 public:
  explicit PublishedProgress(ProgressCounter counter);
  ~PublishedProgress();
  PublishedProgress(const PublishedProgress&) = delete;
  PublishedProgress& operator=(const PublishedProgress&) = delete;

 private:
  bool publish();  // false once the store has failed
  ProgressCounter counter_;
  uint64_t published_;  // io_progress::moved() as last added
  std::unique_ptr<PeriodicThread> thread_;  // last: stopped before the rest goes
};

// While alive, credits what the counter gains to this process's heartbeat, every period (for a
// rank blocked in a collective while others load). A store that fails is logged once and no
// longer read.
class RelayedProgress {
 public:
  explicit RelayedProgress(ProgressCounter counter);
  ~RelayedProgress();
  RelayedProgress(const RelayedProgress&) = delete;
  RelayedProgress& operator=(const RelayedProgress&) = delete;

 private:
  bool relay(bool last);  // false once the store has failed, or at the end
  ProgressCounter counter_;
  bool started_ = false;
  int64_t seen_ = 0;                        // the counter as last read
  std::unique_ptr<PeriodicThread> thread_;  // last: stopped before the rest goes
};

// The value of `key` in `store`, awaited for as long as the counter moves: throws StoreError
// (naming the key and `what`) once `quiet` has passed without the key and without the counter
// moving. What the counter gains is credited to this process's heartbeat. Polls every period; a
// store that fails throws at once.
comm::Bytes await_while_progressing(comm::Store& store, const std::string& key, const ProgressCounter& counter,
                                    comm::Millis quiet, const std::string& what);

}  // namespace tessera::checkpoint
