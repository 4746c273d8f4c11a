// The progress of slow storage I/O that other ranks await, relayed across nodes through the job's
// store, for the launch agents' hang watchdogs (launch/progress.h). Outside its steps a rank may
// wait a long time for another's reads or writes: after its last step every rank for rank 0's
// verdict on the last upload, rank 0 for each node's report; before its first, every rank for the
// slowest rank's load of the checkpoint it resumes from. It moves no bytes meanwhile, and its
// node's agent cannot see another node's. So the rank that reads or uploads adds the bytes it
// moves to one counter of the job (progress_key), and a waiter credits what that counter gains to
// its own heartbeat (io_progress::relay). Only bytes moved are published, never bytes relayed, so
// two waiters cannot keep each other alive: when all the I/O stalls, every waiter sees it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>

#include "comm/store.h"

namespace tessera::checkpoint {

// The job's counter of the bytes its awaited storage I/O moved, in the uploaders' store
// (parallel::Distributed::tier_store), for one attempt.
std::string progress_key(const std::string& attempt);

// While alive, adds the bytes this process moves (io_progress::moved) to the integer at `key` of
// `store`, every `period` when they grew and once more at the end. Null store: does nothing. A
// store that fails is logged once and no longer written; the upload goes on.
class PublishedProgress {
 public:
  PublishedProgress(comm::Store* store, std::string key, comm::Millis period = comm::Millis(1000));
  ~PublishedProgress();
  PublishedProgress(const PublishedProgress&) = delete;
  PublishedProgress& operator=(const PublishedProgress&) = delete;

 private:
  void publish();
  comm::Store* store_;
  std::string key_;
  uint64_t published_;  // io_progress::moved() as last added
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// While alive, credits what the counter at `key` of `store` gains to this process's heartbeat,
// every `period` (for a rank blocked in a collective while others load). Null store: does nothing.
// A store that fails is logged once and no longer read.
class RelayedProgress {
 public:
  RelayedProgress(comm::Store* store, std::string key, comm::Millis period = comm::Millis(1000));
  ~RelayedProgress();
  RelayedProgress(const RelayedProgress&) = delete;
  RelayedProgress& operator=(const RelayedProgress&) = delete;

 private:
  comm::Store* store_;
  std::string key_;
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

// The value of `key` in `store`, awaited for as long as the counter at `progress_key` of
// `progress_store` moves: throws StoreError (naming the key and `what`) once `quiet` has passed
// without the key and without the counter moving. What the counter gains is credited to this
// process's heartbeat. Polls every `poll`; a store that fails throws at once.
comm::Bytes await_while_progressing(comm::Store& store, const std::string& key, comm::Store& progress_store,
                                    const std::string& progress_key, comm::Millis quiet, const std::string& what,
                                    comm::Millis poll = comm::Millis(1000));

}  // namespace tessera::checkpoint
