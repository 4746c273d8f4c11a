// The hang watchdog's reading of a heartbeat: see progress.h.
#include "launch/progress.h"

#include <fmt/format.h>

namespace tessera::launch {

void ProgressWatch::read(const std::string& heartbeat, double now) {
  const heartbeat::Beat b = heartbeat::parse(heartbeat);
  if (!started_ || b.step != step_) {
    moved_ = started_;
    started_ = true;
    step_ = b.step;
    progress_at_ = busy_at_ = now;
  }
  finishing_ = b.finishing;
  io_moved_ = false;
  if (b.io_bytes && b.io_bytes != io_bytes_) {
    io_bytes_ = b.io_bytes;
    io_moved_ = outside_steps();  // within the steps, a background upload is no sign of steps
    if (io_moved_) progress_at_ = now;
  }
  gpu_line_ = b.gpu_util_pct.has_value();
  if (b.gpu_util_pct && *b.gpu_util_pct > 0) busy_at_ = now;
}

void ProgressWatch::peer_io(double now) {
  if (started_ && outside_steps()) progress_at_ = now;
}

std::string ProgressWatch::verdict(double now) const {
  const double stalled = now - progress_at_, idle = now - busy_at_;
  if (stalled > hang_timeout_s_) {
    return fmt::format("made no progress for {:.0f} s (--hang-timeout: no step{})", stalled,
                       outside_steps() ? ", no checkpoint or object-store I/O" : "");
  }
  if (gpu_idle_timeout_s_ > 0 && gpu_line_ && !outside_steps() && stalled > gpu_idle_timeout_s_ &&
      idle > gpu_idle_timeout_s_) {
    return fmt::format(
        "made no progress for {:.0f} s with its GPU idle (0% utilization) all that while "
        "(--gpu-idle-timeout)",
        stalled);
  }
  return "";
}

}  // namespace tessera::launch
