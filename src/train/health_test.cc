// The health check before step 0: passes on healthy ranks with figures (one process, and 1 to 3
// ranks over Gloo in forked processes). Failing ranks are shown end to end in tests/faults_test.sh
// (TESSERA_FAULT is read once per process, so it cannot be set between tests here).
#include "train/health.h"

#include <gtest/gtest.h>

#include "comm/store.h"
#include "comm/test_util.h"
#include "core/threads.h"

namespace tessera::train {
namespace {

using comm::test_util::expect_all_ok;
using comm::test_util::run_ranks;
using comm::test_util::TempDir;

TEST(Health, SingleProcessChecksTheGemm) {
  config::Config config;
  const HealthFigures f = health_check({}, config);
  EXPECT_TRUE(f.gemm_ok);
  EXPECT_TRUE(f.all_reduce_ok);
  // The bound is rigorous but not loose by orders of magnitude: real errors use some of it.
  EXPECT_GT(f.gemm_worst, 0.0);
  EXPECT_LT(f.gemm_worst, 1.0);
  EXPECT_EQ(f.bus_gbps, 0.0);
}

TEST(Health, PassesOnHealthyRanksWithEveryRanksBandwidth) {
  for (int world : {1, 2, 3}) {
    SCOPED_TRACE("world " + std::to_string(world));
    TempDir dir;
    expect_all_ok(run_ranks(world, [&](int rank) {
      set_num_threads(1);  // forked: the parent's OpenMP pool does not survive a fork
      const parallel::Mesh mesh(
          parallel::ParallelDims{1, 1, world, 1}, rank,
          [&](const std::string& prefix) { return comm::make_file_store(dir.path, "job", "r0." + prefix); },
          std::chrono::seconds(10));
      config::Config config;
      parallel::Distributed d;
      d.mesh = &mesh;
      std::vector<double> gbps;
      const HealthFigures f = health_check(d, config, &gbps);
      REQUIRE(f.all_reduce_ok && f.gemm_ok);
      REQUIRE(static_cast<int>(gbps.size()) == world);
      for (double g : gbps) REQUIRE(world == 1 ? g == 0.0 : g > 0.0);
      return 0;
    }));
  }
}

}  // namespace
}  // namespace tessera::train
