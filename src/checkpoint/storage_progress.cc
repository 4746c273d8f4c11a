// Relaying storage I/O's progress through the job's store (checkpoint/storage_progress.h).
#include "checkpoint/storage_progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
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

// Runs tick(false) at once and then every period on a thread of its own, and tick(true) as it is
// destroyed; ends early once tick returns false.
class PeriodicThread {
 public:
  PeriodicThread(comm::Millis period, std::function<bool(bool last)> tick)
      : thread_([this, period, tick = std::move(tick)] {
          std::unique_lock<std::mutex> lock(mu_);
          for (bool last = false; tick(last) && !last;) last = wake_.wait_for(lock, period, [this] { return stop_; });
        }) {}
  ~PeriodicThread() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
  }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  std::mutex mu_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;  // last: started once the rest is there
};

PublishedProgress::PublishedProgress(ProgressCounter counter)
    : counter_(std::move(counter)), published_(io_progress::moved()) {
  if (counter_.store != nullptr) {
    thread_ = std::make_unique<PeriodicThread>(counter_.period, [this](bool) { return publish(); });
  }
}

PublishedProgress::~PublishedProgress() = default;

bool PublishedProgress::publish() {
  const uint64_t now = io_progress::moved();
  if (now == published_) return true;
  try {
    counter_.store->add(counter_.key, static_cast<int64_t>(now - published_));
    published_ = now;
    return true;
  } catch (const Error& e) {
    log::warn(
        "cannot publish the storage I/O's progress ({}): {}; other nodes' watchdogs may take their wait "
        "for a hang",
        counter_.key, e.what());
    return false;
  }
}

RelayedProgress::RelayedProgress(ProgressCounter counter) : counter_(std::move(counter)) {
  if (counter_.store != nullptr) {
    thread_ = std::make_unique<PeriodicThread>(counter_.period, [this](bool last) { return relay(last); });
  }
}

RelayedProgress::~RelayedProgress() = default;

bool RelayedProgress::relay(bool last) {
  if (last) return false;  // no read at the end: nothing waits on it any more
  try {
    const int64_t now = comm::read_counter(*counter_.store, counter_.key);
    if (started_ && now > seen_) io_progress::relay(static_cast<uint64_t>(now - seen_));
    seen_ = started_ ? std::max(seen_, now) : now;
    started_ = true;
    return true;
  } catch (const Error& e) {
    log::warn("cannot read the job's storage progress ({}): {}; this node's watchdog may take the wait for a hang",
              counter_.key, e.what());
    return false;
  }
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
