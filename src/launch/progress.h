// The hang watchdog's reading of a worker's heartbeat file (launch/agent.cc). The worker rewrites
// "STEP\n" in place after every step and, on a GPU, a second line "gpu_util PCT\n" from its NVML
// sampler every 2 s, whether or not steps are being made (train/run.cc). A worker is hung when it
// makes no new step for hang_timeout, or, the seeds' GPU signal, when it has made a step since it
// started, makes none for gpu_idle_timeout and its GPU has shown 0% utilization all that while: a rank
// stuck outside its kernels (a lost peer, a deadlock) idles its GPU, while a slow step keeps it busy.
// Once its steps are done the worker writes "STEP finishing": its last checkpoint, upload and
// final files keep it busy off the GPU, so from then on only hang_timeout applies.
#pragma once

#include <optional>
#include <string>

namespace tessera::launch {

struct Beat {
  std::string step;                    // the first line's step as written ("" before the first step)
  bool finishing = false;              // the line says "STEP finishing": the steps are done
  std::optional<double> gpu_util_pct;  // the second line's figure, when there is one whole
};
Beat parse_beat(const std::string& text);

class ProgressWatch {
 public:
  // gpu_idle_timeout_s <= 0: only hang_timeout applies.
  ProgressWatch(double hang_timeout_s, double gpu_idle_timeout_s)
      : hang_timeout_s_(hang_timeout_s), gpu_idle_timeout_s_(gpu_idle_timeout_s) {}

  // One read of the heartbeat file at `now` (seconds on a monotonic clock): "" while the worker is
  // making progress, else why it counts as hung (for the agent's log and the job's summary).
  std::string observe(const std::string& heartbeat, double now);

 private:
  double hang_timeout_s_, gpu_idle_timeout_s_;
  bool started_ = false, moved_ = false;  // moved: a step made since the first read
  std::string step_;
  double progress_at_ = 0, busy_at_ = 0;  // the last new step; the last time the GPU was seen busy
};

}  // namespace tessera::launch
