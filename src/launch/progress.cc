// The hang watchdog's reading of a heartbeat: see progress.h.
#include "launch/progress.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>

namespace tessera::launch {

Beat parse_beat(const std::string& text) {
  Beat b;
  const size_t eol = text.find('\n');
  b.step = text.substr(0, eol);
  b.step.erase(b.step.find_last_not_of(' ') + 1);  // the line is padded to a fixed width
  constexpr std::string_view kFinishing = " finishing";
  b.finishing = b.step.size() > kFinishing.size() && b.step.ends_with(kFinishing);
  if (b.finishing) b.step.resize(b.step.size() - kFinishing.size());
  if (eol == std::string::npos) return b;
  // "gpu_util PCT" padded with spaces, then a newline: a line caught half-written does not count.
  const std::string line = text.substr(eol + 1);
  constexpr std::string_view kKey = "gpu_util ";
  if (line.rfind(kKey, 0) != 0 || line.empty() || line.back() != '\n') return b;
  const char* first = line.data() + kKey.size();
  const char* last = line.data() + line.size() - 1;
  while (first < last && *first == ' ') ++first;
  double v = 0;
  const auto [end, ec] = std::from_chars(first, last, v);
  if (ec == std::errc() && end != first && std::isfinite(v) && v >= 0) {
    const char* rest = end;
    while (rest < last && *rest == ' ') ++rest;
    if (rest == last) b.gpu_util_pct = v;
  }
  return b;
}

std::string ProgressWatch::observe(const std::string& heartbeat, double now) {
  const Beat b = parse_beat(heartbeat);
  if (!started_ || b.step != step_) {
    moved_ = started_;
    started_ = true;
    step_ = b.step;
    progress_at_ = busy_at_ = now;
  }
  if (b.gpu_util_pct && *b.gpu_util_pct > 0) busy_at_ = now;
  const double stalled = now - progress_at_, idle = now - busy_at_;
  if (stalled > hang_timeout_s_) return fmt::format("made no progress for {:.0f} s (--hang-timeout)", stalled);
  if (gpu_idle_timeout_s_ > 0 && b.gpu_util_pct && moved_ && !b.finishing && stalled > gpu_idle_timeout_s_ &&
      idle > gpu_idle_timeout_s_) {
    return fmt::format(
        "made no progress for {:.0f} s with its GPU idle (0% utilization) all that while "
        "(--gpu-idle-timeout)",
        stalled);
  }
  return "";
}

}  // namespace tessera::launch
