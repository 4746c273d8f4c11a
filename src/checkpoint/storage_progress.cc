// Relaying storage I/O's progress through the job's store (checkpoint/storage_progress.h).
#include "checkpoint/storage_progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "comm/process_group.h"
#include "core/check.h"
#include "core/error.h"
#include "core/io_progress.h"
#include "core/log.h"

namespace tessera::checkpoint {
ProgressCounter progress_counter(const parallel::Distributed& dist) {
  return {dist.tier_store, fmt::format("tier.{}.moved", dist.attempt), progress_period(dist.world_size())};
}

comm::Millis progress_period(int world_size) { return comm::Millis(std::clamp(world_size / 128, 1, 30) * 1000); }

PublishedProgress::PublishedProgress(ProgressCounter counter)
    : counter_(std::move(counter)), published_(io_progress::moved()) {
  if (counter_.store == nullptr) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    while (counter_.store != nullptr) {  // until the store fails
      const bool last = wake_.wait_for(lock, counter_.period, [this] { return stop_; });
      publish();
      if (last) return;
    }
  });
}

PublishedProgress::~PublishedProgress() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void PublishedProgress::publish() {
  const uint64_t now = io_progress::moved();
  if (now == published_) return;
  try {
    counter_.store->add(counter_.key, static_cast<int64_t>(now - published_));
    published_ = now;
  } catch (const Error& e) {
    log::warn(
        "cannot publish the storage I/O's progress ({}): {}; other nodes' watchdogs may take their wait "
        "for a hang",
        counter_.key, e.what());
    counter_.store = nullptr;
  }
}

RelayedProgress::RelayedProgress(ProgressCounter counter) : counter_(std::move(counter)) {
  if (counter_.store == nullptr) return;
  thread_ = std::thread([this] {
    std::unique_lock<std::mutex> lock(mu_);
    try {
      for (int64_t seen = comm::read_counter(*counter_.store, counter_.key);;) {
        if (wake_.wait_for(lock, counter_.period, [this] { return stop_; })) return;
        const int64_t now = comm::read_counter(*counter_.store, counter_.key);
        if (now > seen) io_progress::relay(static_cast<uint64_t>(now - seen));
        seen = std::max(seen, now);
      }
    } catch (const Error& e) {
      log::warn("cannot read the job's storage progress ({}): {}; this node's watchdog may take the wait for a hang",
                counter_.key, e.what());
    }
  });
}

RelayedProgress::~RelayedProgress() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

comm::Bytes await_while_progressing(comm::Store& store, const std::string& key, const ProgressCounter& counter,
                                    comm::Millis quiet, const std::string& what) {
  using Clock = std::chrono::steady_clock;
  CHECK(counter.store != nullptr);
  int64_t seen = comm::read_counter(*counter.store, counter.key);
  Clock::time_point moved_at = Clock::now();
  for (;;) {
    const auto left = std::chrono::duration_cast<comm::Millis>(moved_at + quiet - Clock::now());
    try {
      return store.get(key, std::clamp(left, comm::Millis(0), counter.period));
    } catch (const comm::StoreError&) {
      if (store.check({key})) continue;  // set just after the wait; a store that is gone throws here
    }
    const int64_t now = comm::read_counter(*counter.store, counter.key);
    if (now > seen) {
      io_progress::relay(static_cast<uint64_t>(now - seen));
      seen = now;
      moved_at = Clock::now();
    } else if (Clock::now() >= moved_at + quiet) {
      throw comm::StoreError(
          fmt::format("no {} ({}) within {} ms of the storage I/O's last byte", what, key, quiet.count()));
    }
  }
}

}  // namespace tessera::checkpoint
