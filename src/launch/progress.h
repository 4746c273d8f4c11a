// The hang watchdog's reading of a worker's heartbeat file (core/heartbeat.h; launch/agent.cc reads
// it). A worker is hung when it makes no progress for hang_timeout: no new step or, outside its
// steps (before the first, and once finishing), no bytes moved through storage either (restoring
// a large checkpoint from the object store, writing and uploading the last one). Ranks waiting
// outside their steps for a peer that moves the bytes (the run's last upload, a checkpoint load)
// are credited with the peer's progress by the agent (peer_io). Or, the seeds' GPU signal: it has
// made a step since it started, makes none for gpu_idle_timeout and its GPU has shown 0%
// utilization all that while: a rank stuck outside its kernels (a lost peer, a deadlock) idles its
// GPU, while a slow step keeps it busy. Once finishing, the GPU rule no longer applies.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "core/heartbeat.h"

namespace tessera::launch {

class ProgressWatch {
 public:
  // gpu_idle_timeout_s <= 0: only hang_timeout applies.
  ProgressWatch(double hang_timeout_s, double gpu_idle_timeout_s)
      : hang_timeout_s_(hang_timeout_s), gpu_idle_timeout_s_(gpu_idle_timeout_s) {}

  // One read of the heartbeat file at `now` (seconds on a monotonic clock).
  void read(const std::string& heartbeat, double now);
  // That read saw bytes moved outside the worker's steps.
  bool io_moved() const { return io_moved_; }
  // Another worker of the job moved bytes outside its steps at `now`: progress for this one too
  // when it is outside its steps.
  void peer_io(double now);
  // "" while the worker is making progress, else why it counts as hung (for the agent's log and
  // the job's summary).
  std::string verdict(double now) const;

  std::string observe(const std::string& heartbeat, double now) {
    read(heartbeat, now);
    return verdict(now);
  }

 private:
  bool outside_steps() const { return !moved_ || finishing_; }

  double hang_timeout_s_, gpu_idle_timeout_s_;
  bool started_ = false, moved_ = false;  // moved: a step made since the first read
  bool finishing_ = false, io_moved_ = false;
  bool gpu_line_ = false;  // the last read had a gpu_util figure
  std::string step_;
  std::optional<uint64_t> io_bytes_;
  double progress_at_ = 0, busy_at_ = 0;  // the last progress; the last time the GPU was seen busy
};

}  // namespace tessera::launch
