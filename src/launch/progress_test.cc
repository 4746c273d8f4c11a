// The hang watchdog's verdicts on recorded heartbeat sequences (what train/run.cc writes: the step
// line padded to 20 columns, on a GPU a gpu_util line every 2 s).
#include "launch/progress.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>

namespace tessera::launch {
namespace {

std::string beat(int step, double util = -1) {
  std::string text = fmt::format("{:<20}\n", step);
  if (util >= 0) text += fmt::format("gpu_util {:<8.1f}\n", util);
  return text;
}

TEST(ParseBeat, StepAndGpuLine) {
  EXPECT_EQ(parse_beat(beat(12)).step, "12");
  EXPECT_FALSE(parse_beat(beat(12)).gpu_util_pct);
  EXPECT_EQ(parse_beat(beat(12, 97.5)).gpu_util_pct, 97.5);
  EXPECT_EQ(parse_beat(beat(12, 0)).gpu_util_pct, 0.0);
  EXPECT_EQ(parse_beat("").step, "");
  // A line caught half-written, or anything else, gives no figure.
  EXPECT_FALSE(parse_beat(beat(12) + "gpu_util 4").gpu_util_pct);
  EXPECT_FALSE(parse_beat(beat(12) + "gpu_util 4x\n").gpu_util_pct);
  EXPECT_FALSE(parse_beat(beat(12) + "gpu_util -1\n").gpu_util_pct);
  EXPECT_FALSE(parse_beat(beat(12) + "gpu_util nan\n").gpu_util_pct);
}

TEST(ProgressWatch, StepsKeepAWorkerAlive) {
  ProgressWatch w(1800, 300);
  for (int t = 0; t <= 3600; t += 10) EXPECT_EQ(w.observe(beat(t / 100, 0), t), "") << t;  // a step per 100 s
}

TEST(ProgressWatch, NoStepAndAnIdleGpuIsAHangAfterTheGpuTimeout) {
  ProgressWatch w(1800, 300);
  EXPECT_EQ(w.observe(beat(0), 0), "");  // as the agent starts the worker
  EXPECT_EQ(w.observe(beat(7, 95), 0), "");
  for (int t = 2; t <= 300; t += 2) EXPECT_EQ(w.observe(beat(7, 0), t), "") << t;
  const std::string why = w.observe(beat(7, 0), 302);
  EXPECT_NE(why.find("made no progress for 302 s with its GPU idle (0% utilization)"), std::string::npos) << why;
}

TEST(ProgressWatch, ABusyGpuWaitsForTheHangTimeout) {
  // A long step (or a collective spinning on the GPU) keeps its GPU busy: only --hang-timeout applies.
  ProgressWatch w(1800, 300);
  w.observe(beat(0), 0);
  w.observe(beat(7, 95), 0);
  for (int t = 2; t <= 1800; t += 2) EXPECT_EQ(w.observe(beat(7, t % 600 == 0 ? 0 : 100), t), "") << t;
  EXPECT_NE(w.observe(beat(7, 100), 1802).find("made no progress for 1802 s (--hang-timeout)"), std::string::npos);
}

TEST(ProgressWatch, AFinishingWorkerIdlesItsGpuUnderTheHangTimeoutOnly) {
  // After the last step: the last checkpoint written and uploaded, the final weights, all off the GPU.
  const std::string finishing = fmt::format("{:<20}\ngpu_util {:<8.1f}\n", "7 finishing", 0.0);
  EXPECT_TRUE(parse_beat(finishing).finishing);
  EXPECT_EQ(parse_beat(finishing).step, "7");
  EXPECT_FALSE(parse_beat(beat(7, 0)).finishing);
  EXPECT_FALSE(parse_beat(" finishing\n").finishing);
  ProgressWatch w(1800, 300);
  w.observe(beat(0), 0);
  w.observe(beat(7, 95), 0);
  for (int t = 2; t <= 1800; t += 2) EXPECT_EQ(w.observe(finishing, t), "") << t;
  // --hang-timeout counts from the last step.
  EXPECT_NE(w.observe(finishing, 1802).find("made no progress for 1802 s (--hang-timeout)"), std::string::npos);
}

TEST(ProgressWatch, TheGpuRuleNeedsAStepAndAGpuLine) {
  // Start-up (loading, resuming) idles the GPU before the first step: not a hang by the GPU rule.
  ProgressWatch startup(1800, 300);
  for (int t = 0; t <= 1000; t += 2) EXPECT_EQ(startup.observe(beat(0, 0), t), "") << t;
  // A CPU run writes no GPU line.
  ProgressWatch cpu(1800, 300);
  cpu.observe(beat(0), 0);
  for (int t = 0; t <= 1800; t += 2) EXPECT_EQ(cpu.observe(beat(3), t), "") << t;
  EXPECT_NE(cpu.observe(beat(3), 1802), "");
  // gpu_idle_timeout 0: off.
  ProgressWatch off(1800, 0);
  off.observe(beat(0), 0);
  for (int t = 0; t <= 1800; t += 2) EXPECT_EQ(off.observe(beat(3, 0), t), "") << t;
}

}  // namespace
}  // namespace tessera::launch
