// The heartbeat file through which a worker (train/run.cc) shows its launch agent that it is alive
// (launch/progress.h judges it). Rewritten in place, without fsync (the agent reads it through the
// page cache); each line has a fixed width, so a rewrite never leaves the tail of a longer one:
//
//   STEP[ finishing]   at 0: the last step made ("0" before the first, as the agent writes it when
//                      it starts the worker); " finishing" once the steps are done (the last
//                      checkpoint, its upload and the final files, all off the GPU)
//   io BYTES           then: io_progress::seen() (core/io_progress.h), from the worker's pulse
//                      thread every second
//   gpu_util PCT       then, on a GPU once a step is made: its utilization, from the same thread
//
// A line counts only whole: one caught half-written (no newline yet) gives no figure.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace tessera::heartbeat {

struct Beat {
  std::string step;                    // the first line's step as written ("" for an empty file)
  bool finishing = false;              // the line says "STEP finishing": the steps are done
  std::optional<uint64_t> io_bytes;    // the io line's figure, when there is one whole
  std::optional<double> gpu_util_pct;  // the gpu_util line's figure, when there is one whole
};
Beat parse(const std::string& text);

// The first line, written at offset 0: kStepColumns wide, then its newline.
inline constexpr int kStepColumns = 20;
std::string step_line(int64_t step, bool finishing = false);

// The io line and, when given, the gpu_util line: one write at offset kPulseAt.
inline constexpr int64_t kPulseAt = kStepColumns + 1;
std::string pulse_lines(uint64_t io_bytes, std::optional<double> gpu_util_pct);

}  // namespace tessera::heartbeat
