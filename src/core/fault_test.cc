// TESSERA_FAULT parsing: every phase and kind, wildcards, and the errors that name the bad part.
#include "core/fault.h"

#include <gtest/gtest.h>

#include <string>

namespace tessera::fault {
namespace {

Spec ok(const std::string& text) {
  Spec s;
  std::string error;
  EXPECT_TRUE(parse(text, &s, &error)) << text << ": " << error;
  return s;
}

std::string refused(const std::string& text) {
  Spec s;
  std::string error;
  EXPECT_FALSE(parse(text, &s, &error)) << text;
  EXPECT_FALSE(s.active);
  return error;
}

TEST(Fault, ParsesRankStepPhaseKind) {
  Spec s = ok("1:3:backward:nan");
  EXPECT_TRUE(s.active);
  EXPECT_EQ(s.rank, 1);
  EXPECT_EQ(s.step, 3);
  EXPECT_EQ(s.phase, "backward");
  EXPECT_EQ(s.kind, Kind::kNan);
  EXPECT_EQ(s.kind_name, "nan");

  s = ok("*:*:forward:kill");
  EXPECT_EQ(s.rank, -1);
  EXPECT_EQ(s.step, -1);
  EXPECT_EQ(s.kind, Kind::kKill);

  s = ok("0:0:health:fail");
  EXPECT_EQ(s.step, 0);
  EXPECT_EQ(s.kind, Kind::kFail);
  EXPECT_EQ(ok("1:0:health:gpu").kind, Kind::kGpu);
  EXPECT_EQ(ok("1:0:health:allreduce").kind, Kind::kAllReduce);

  // The kinds and phases that existed before keep working.
  EXPECT_EQ(ok("0:4:checkpoint.shard:kill").kind, Kind::kKill);
  EXPECT_EQ(ok("1:8:checkpoint.shard:io").kind, Kind::kIo);
  EXPECT_EQ(ok("0:8:checkpoint.manifest:io").kind, Kind::kIo);
  EXPECT_EQ(ok("1:*:shm.attach:io").phase, "shm.attach");
  EXPECT_EQ(ok("1:0:checkpoint.load:slow").phase, "checkpoint.load");
  EXPECT_EQ(ok("0:8:checkpoint.commit:exit").kind, Kind::kExit);
  for (const char* phase : {"forward", "backward", "optimizer"}) {
    for (const char* kind : {"kill", "exit", "hang", "slow"}) {
      const Spec k = ok(std::string("2:5:") + phase + ":" + kind);
      EXPECT_EQ(k.phase, phase);
      EXPECT_EQ(k.kind_name, kind);
    }
  }
  EXPECT_EQ(ok("0:2:optimizer:hang").kind, Kind::kHang);
  EXPECT_EQ(ok("0:2:forward:slow").kind, Kind::kSlow);
}

TEST(Fault, RefusesMalformedSpecsNamingThePart) {
  EXPECT_NE(refused("").find("RANK:STEP:PHASE:KIND"), std::string::npos);
  EXPECT_NE(refused("1:3:backward").find("RANK:STEP:PHASE:KIND"), std::string::npos);
  EXPECT_NE(refused("x:3:backward:nan").find("RANK 'x'"), std::string::npos);
  EXPECT_NE(refused("-1:3:backward:nan").find("RANK '-1'"), std::string::npos);
  EXPECT_NE(refused("1:three:backward:nan").find("STEP 'three'"), std::string::npos);
  EXPECT_NE(refused("1::backward:nan").find("STEP ''"), std::string::npos);
  EXPECT_NE(refused("1:3:backwards:nan").find("PHASE 'backwards'"), std::string::npos);
  EXPECT_NE(refused("1:3:backward:boom").find("KIND 'boom'"), std::string::npos);
  EXPECT_NE(refused("1:3:backward:kill:extra").find("KIND 'kill:extra'"), std::string::npos);
  // nan and fail act only where a caller acts on them.
  const std::string nan_at_forward = refused("1:3:forward:nan");
  EXPECT_NE(nan_at_forward.find("backward only"), std::string::npos) << nan_at_forward;
  EXPECT_NE(refused("1:0:forward:fail").find("health only"), std::string::npos);
  EXPECT_NE(refused("1:0:forward:gpu").find("health only"), std::string::npos);
}

TEST(Fault, PointIsInertWithoutTheVariable) {
  // The test binary runs without TESSERA_FAULT: every point is a no-op.
  EXPECT_EQ(point("backward", 0, 1), Kind::kNone);
  EXPECT_EQ(point("health", 0, 0), Kind::kNone);
}

}  // namespace
}  // namespace tessera::fault
