// The hang watchdog's verdicts on recorded heartbeat sequences (core/heartbeat.h's lines as
// train/run.cc writes them: the step line, every second the bytes moved through storage, on a GPU
// its utilization).
#include "launch/progress.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "core/heartbeat.h"

namespace tessera::launch {
namespace {

std::string beat(int step, double util = -1, uint64_t io = 0) {
  return heartbeat::step_line(step) +
         heartbeat::pulse_lines(io, util >= 0 ? std::optional<double>(util) : std::nullopt);
}
std::string finishing(int step, uint64_t io = 0, double util = 0) {
  return heartbeat::step_line(step, /*finishing=*/true) + heartbeat::pulse_lines(io, util);
}
bool hung_by_hang_timeout(const std::string& why) { return why.find("(--hang-timeout") != std::string::npos; }

TEST(ProgressWatch, StepsKeepAWorkerAlive) {
  ProgressWatch w(1800, 300);
  for (int t = 0; t <= 3600; t += 10) EXPECT_EQ(w.observe(beat(t / 100, 0), t), "") << t;  // a step per 100 s
}

TEST(ProgressWatch, NoStepAndAnIdleGpuIsAHangAfterTheGpuTimeout) {
  ProgressWatch w(1800, 300);
  EXPECT_EQ(w.observe(heartbeat::step_line(0), 0), "");  // as the agent starts the worker
  EXPECT_EQ(w.observe(beat(7, 95), 0), "");
  for (int t = 2; t <= 300; t += 2) EXPECT_EQ(w.observe(beat(7, 0), t), "") << t;
  const std::string why = w.observe(beat(7, 0), 302);
  EXPECT_NE(why.find("made no progress for 302 s with its GPU idle (0% utilization)"), std::string::npos) << why;
}

TEST(ProgressWatch, ABusyGpuWaitsForTheHangTimeout) {
  // A long step (or a collective spinning on the GPU) keeps its GPU busy: only --hang-timeout applies.
  ProgressWatch w(1800, 300);
  w.observe(heartbeat::step_line(0), 0);
  w.observe(beat(7, 95), 0);
  for (int t = 2; t <= 1800; t += 2) EXPECT_EQ(w.observe(beat(7, t % 600 == 0 ? 0 : 100), t), "") << t;
  const std::string why = w.observe(beat(7, 100), 1802);
  EXPECT_NE(why.find("made no progress for 1802 s (--hang-timeout: no step)"), std::string::npos) << why;
}

TEST(ProgressWatch, AFinishingWorkerIdlesItsGpuUnderTheHangTimeoutOnly) {
  // After the last step: the last checkpoint written and uploaded, the final weights, all off the GPU.
  ProgressWatch w(1800, 300);
  w.observe(heartbeat::step_line(0), 0);
  w.observe(beat(7, 95), 0);
  for (int t = 2; t <= 1800; t += 2) EXPECT_EQ(w.observe(finishing(7), t), "") << t;
  // --hang-timeout counts from the last step when no bytes move.
  const std::string why = w.observe(finishing(7), 1802);
  EXPECT_NE(why.find("made no progress for 1802 s (--hang-timeout: no step, no checkpoint or object-store I/O)"),
            std::string::npos)
      << why;
}

TEST(ProgressWatch, BytesMovedOutsideTheStepsAreProgress) {
  // Before the first step: a large checkpoint restored from the object store, an hour long.
  ProgressWatch startup(1800, 300);
  startup.observe(heartbeat::step_line(0), 0);
  for (int t = 1; t <= 3600; ++t) EXPECT_EQ(startup.observe(beat(0, 0, t / 60 * 1000), t), "") << t;
  EXPECT_EQ(startup.observe(beat(5, 90, 60000), 3601), "");  // and then the first step
  // Once finishing: the last checkpoint's upload, an hour long; then it stops moving.
  ProgressWatch end(1800, 300);
  end.observe(heartbeat::step_line(0), 0);
  end.observe(beat(7, 95), 0);
  for (int t = 1; t <= 3600; ++t) EXPECT_EQ(end.observe(finishing(7, t / 60 * 1000), t), "") << t;
  for (int t = 3601; t <= 3600 + 1800; ++t) EXPECT_EQ(end.observe(finishing(7, 60000), t), "") << t;
  EXPECT_TRUE(hung_by_hang_timeout(end.observe(finishing(7, 60000), 3600 + 1802)));
}

TEST(ProgressWatch, BytesMovedWithinTheStepsAreNoSignOfSteps) {
  // A rank stuck in a step while its checkpoints' uploads go on in the background is hung.
  ProgressWatch w(1800, 0);
  w.observe(heartbeat::step_line(0), 0);
  w.observe(beat(7), 0);
  for (int t = 1; t <= 1800; ++t) {
    w.observe(beat(7, -1, t * 1000), t);
    EXPECT_FALSE(w.io_moved()) << t;
    EXPECT_EQ(w.verdict(t), "") << t;
  }
  EXPECT_TRUE(hung_by_hang_timeout(w.observe(beat(7, -1, 1801000), 1801)));
}

TEST(ProgressWatch, APeersBytesCountOnlyOutsideTheSteps) {
  // Rank 1 waits for rank 0's verdict on the last upload while rank 0 uploads: alive.
  ProgressWatch waiting(1800, 300), stepping(1800, 300);
  for (ProgressWatch* w : {&waiting, &stepping}) {
    w->observe(heartbeat::step_line(0), 0);
    w->observe(beat(7, 95), 0);
  }
  for (int t = 1; t <= 3600; ++t) {
    waiting.read(finishing(7), t);
    stepping.read(beat(7, 95), t);
    waiting.peer_io(t);
    stepping.peer_io(t);
    EXPECT_EQ(waiting.verdict(t), "") << t;
    if (t <= 1800) {
      EXPECT_EQ(stepping.verdict(t), "") << t;
    }
  }
  // A rank stuck in a step is not kept alive by another's upload.
  EXPECT_TRUE(hung_by_hang_timeout(stepping.verdict(3600)));
}

TEST(ProgressWatch, TheGpuRuleNeedsAStepAndAGpuLine) {
  // Start-up (loading, resuming) idles the GPU before the first step: not a hang by the GPU rule.
  ProgressWatch startup(1800, 300);
  for (int t = 0; t <= 1000; t += 2) EXPECT_EQ(startup.observe(beat(0, 0), t), "") << t;
  // A CPU run writes no GPU line.
  ProgressWatch cpu(1800, 300);
  cpu.observe(heartbeat::step_line(0), 0);
  for (int t = 0; t <= 1800; t += 2) EXPECT_EQ(cpu.observe(beat(3), t), "") << t;
  EXPECT_NE(cpu.observe(beat(3), 1802), "");
  // gpu_idle_timeout 0: off.
  ProgressWatch off(1800, 0);
  off.observe(heartbeat::step_line(0), 0);
  for (int t = 0; t <= 1800; t += 2) EXPECT_EQ(off.observe(beat(3, 0), t), "") << t;
}

}  // namespace
}  // namespace tessera::launch
