#include "train/device.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "core/threads.h"

namespace tessera::train {
namespace {

// The CPUs a thread may run on after ComputeDevice::bind_cpus (which binds the calling thread, as
// a worker's main thread before it starts any other).
std::vector<int> cpus_after_binding(const config::Config& c, int local_rank, int local_world) {
  std::vector<int> cpus;
  std::thread([&] {
    ComputeDevice device(c, local_world, local_rank, local_world);
    device.bind_cpus(c, local_rank, local_world);
    cpus = allowed_cpus();
  }).join();
  return cpus;
}

config::Config cpu_config() {
  config::Config c;
  c.train.device = config::Device::kCpu;
  return c;
}

TEST(CpuBind, AutoGivesEachLocalRankItsBlock) {
  const std::vector<int> all = allowed_cpus();
  if (all.size() < 2) GTEST_SKIP() << "one CPU: nothing to split";
  const config::Config c = cpu_config();
  EXPECT_EQ(cpus_after_binding(c, 0, 2), cpu_block(all, 0, 2));
  EXPECT_EQ(cpus_after_binding(c, 1, 2), cpu_block(all, 1, 2));
  EXPECT_NE(cpus_after_binding(c, 0, 2), cpus_after_binding(c, 1, 2));
}

TEST(CpuBind, NothingIsBoundWhereItWouldNotHelp) {
  const std::vector<int> all = allowed_cpus();
  config::Config c = cpu_config();
  EXPECT_EQ(cpus_after_binding(c, 0, 1), all) << "a single rank on its node";
  EXPECT_EQ(cpus_after_binding(c, 0, static_cast<int>(all.size()) + 1), all) << "more ranks than CPUs";
  c.train.threads = static_cast<int64_t>(all.size());
  EXPECT_EQ(cpus_after_binding(c, 0, 2), all) << "more threads than a block has";
  c.train.threads = 0;
  c.parallel.cpu_bind = config::CpuBind::kNone;
  EXPECT_EQ(cpus_after_binding(c, 1, 2), all) << "parallel.cpu_bind = none";
}

}  // namespace
}  // namespace tessera::train
