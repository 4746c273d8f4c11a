// The heartbeat file's lines as the worker writes them and the agent reads them back.
#include "core/heartbeat.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::heartbeat {
namespace {

TEST(Heartbeat, WhatTheWorkerWritesReadsBack) {
  const std::string text = step_line(12) + pulse_lines(123456789, 97.5);
  ASSERT_EQ(step_line(12).size(), static_cast<size_t>(kPulseAt));
  const Beat b = parse(text);
  EXPECT_EQ(b.step, "12");
  EXPECT_FALSE(b.finishing);
  EXPECT_EQ(b.io_bytes, 123456789u);
  EXPECT_EQ(b.gpu_util_pct, 97.5);
  // A CPU run writes no gpu_util line; a fresh file holds the step line alone.
  EXPECT_FALSE(parse(step_line(12) + pulse_lines(0, std::nullopt)).gpu_util_pct);
  EXPECT_EQ(parse(step_line(12) + pulse_lines(0, std::nullopt)).io_bytes, 0u);
  EXPECT_FALSE(parse(step_line(0)).io_bytes);
  EXPECT_EQ(parse(step_line(0)).step, "0");
  EXPECT_EQ(parse(pulse_lines(0, 0.0) + step_line(3)).gpu_util_pct, 0.0);  // an order of lines is no matter
  EXPECT_EQ(parse("").step, "");
}

TEST(Heartbeat, Finishing) {
  const Beat b = parse(step_line(7, /*finishing=*/true) + pulse_lines(5, 0.0));
  EXPECT_TRUE(b.finishing);
  EXPECT_EQ(b.step, "7");
  EXPECT_EQ(b.gpu_util_pct, 0.0);
  EXPECT_FALSE(parse(step_line(7)).finishing);
  EXPECT_FALSE(parse(" finishing\n").finishing);
}

TEST(Heartbeat, AHalfWrittenOrForeignLineGivesNoFigure) {
  const std::string step = step_line(12);
  EXPECT_FALSE(parse(step + "io 4").io_bytes);
  EXPECT_FALSE(parse(step + "io 4x\n").io_bytes);
  EXPECT_FALSE(parse(step + "io -4\n").io_bytes);
  EXPECT_FALSE(parse(step + "io\n").io_bytes);
  EXPECT_FALSE(parse(step + "gpu_util 4").gpu_util_pct);
  EXPECT_FALSE(parse(step + "gpu_util 4x\n").gpu_util_pct);
  EXPECT_FALSE(parse(step + "gpu_util -1\n").gpu_util_pct);
  EXPECT_FALSE(parse(step + "gpu_util nan\n").gpu_util_pct);
  EXPECT_FALSE(parse(step + "gpu_util inf\n").gpu_util_pct);
  // The io line whole, the gpu_util line after it caught half-written.
  const Beat b = parse(step + pulse_lines(9, std::nullopt) + "gpu_util 5");
  EXPECT_EQ(b.io_bytes, 9u);
  EXPECT_FALSE(b.gpu_util_pct);
}

}  // namespace
}  // namespace tessera::heartbeat
