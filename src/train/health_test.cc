// The health check before step 0: passes on healthy ranks with figures (one process, and 1 to 3
// ranks over Gloo in forked processes). Failing ranks are shown end to end in tests/faults_test.sh
// (TESSERA_FAULT is read once per process, so it cannot be set between tests here).
#include "train/health.h"

#include <gtest/gtest.h>

#include "comm/store.h"
#include "comm/test_util.h"
#include "core/error.h"
#include "core/host.h"
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
      const HealthFigures f = health_check(d, config, kernels::cpu_backend(), std::nullopt, &gbps);
      REQUIRE(f.all_reduce_ok && f.gemm_ok);
      REQUIRE(static_cast<int>(gbps.size()) == world);
      for (double g : gbps) REQUIRE(world == 1 ? g == 0.0 : g > 0.0);
      return 0;
    }));
  }
}

// A GPU as NVML described one in service (metrics/gpu_test.cc has the verdicts' cases).
metrics::GpuReading recorded_gpu() {
  metrics::GpuReading r;
  r.name = "NVIDIA H100 80GB HBM3";
  r.pci_bus_id = "00000000:19:00.0";
  r.serial = "1650123456789";
  r.uuid = "GPU-8f3c2a1e-5b7d-4c9e-a2f1-0d6e4b3c1000";
  r.ecc_dbe_volatile = 0;
  r.throttle_reasons = metrics::throttle::kSwPowerCap;
  return r;
}

TEST(Health, AHealthyOrMerelyDegradedGpuPasses) {
  config::Config config;
  EXPECT_TRUE(health_check({}, config, kernels::cpu_backend(), recorded_gpu()).gpu_ok);
  metrics::GpuReading app_fault = recorded_gpu();
  app_fault.xid_count = 1, app_fault.last_xid = 13;  // the application's own fault: a warning
  EXPECT_TRUE(health_check({}, config, kernels::cpu_backend(), app_fault).gpu_ok);
}

// Rank 1's GPU has uncorrectable ECC errors: every rank stops with the same error naming rank 1's
// GPU by host, PCI bus id and serial, and not rank 0.
TEST(Health, AFailedGpuStopsEveryRankNamingIt) {
  TempDir dir;
  expect_all_ok(run_ranks(2, [&](int rank) {
    set_num_threads(1);
    const parallel::Mesh mesh(
        parallel::ParallelDims{1, 1, 2, 1}, rank,
        [&](const std::string& prefix) { return comm::make_file_store(dir.path, "job", "r0." + prefix); },
        std::chrono::seconds(10));
    config::Config config;
    parallel::Distributed d;
    d.mesh = &mesh;
    metrics::GpuReading gpu = recorded_gpu();
    if (rank == 1) gpu.ecc_dbe_volatile = 3;
    try {
      health_check(d, config, kernels::cpu_backend(), gpu);
    } catch (const HealthError& e) {
      const std::string m = e.what();
      REQUIRE(m.find("failed on 1 of 2 rank(s): rank 1 (GPU 0 (NVIDIA H100 80GB HBM3, PCI 00000000:19:00.0, serial "
                     "1650123456789, GPU-8f3c2a1e-5b7d-4c9e-a2f1-0d6e4b3c1000) on host " +
                     host_name() + ": failed: 3 uncorrectable (double-bit) ECC errors") != std::string::npos);
      REQUIRE(m.find("rank 0 (") == std::string::npos);
      return 0;
    }
    return 1;  // no error: rank 1's GPU went unnoticed
  }));
}

}  // namespace
}  // namespace tessera::train
