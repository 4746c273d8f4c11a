// The health check before step 0 on a GPU: the GEMM runs on the device against the reference, the
// device memory bandwidth is measured and held against parallel.health_min_memory_gbps. Skipped
// without a device (tools/cuda_emu runs it on the emulation; scripts/gpu_check.sh on a GPU).
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/error.h"
#include "kernels/backend.h"
#include "kernels/cuda/test_util.h"
#include "train/health.h"

namespace tessera::train {
namespace {

TEST(HealthOnCuda, GemmOnTheDeviceAndMemoryBandwidth) {
  REQUIRE_CUDA_DEVICE();
  const std::unique_ptr<kernels::Backend> gpu = kernels::make_cuda_backend({});
  config::Config config;
  const HealthFigures f = health_check({}, config, *gpu);
  EXPECT_TRUE(f.gemm_ok);
  EXPECT_LT(f.gemm_worst, 1.0);
  RecordProperty("gemm_worst", std::to_string(f.gemm_worst));
  EXPECT_TRUE(f.memory_ok);
  EXPECT_GT(f.memory_gbps, 0.0);
  RecordProperty("memory_gbps", std::to_string(f.memory_gbps));

  // A floor no device reaches (1 PB/s) fails the check, naming the key and the figure.
  config.parallel.health_min_memory_gbps = 1e6;
  try {
    health_check({}, config, *gpu);
    ADD_FAILURE() << "a bandwidth below the floor passed";
  } catch (const HealthError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("rank 0 (device memory bandwidth "), std::string::npos) << m;
    EXPECT_NE(m.find("below parallel.health_min_memory_gbps = 1000000"), std::string::npos) << m;
  }
}

}  // namespace
}  // namespace tessera::train
