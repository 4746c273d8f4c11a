// GPU verdicts and exposition on recorded readings (what NVML answered on real GPUs in the four
// states an operator meets most: a healthy GPU under load, one with uncorrectable ECC errors and a
// pending row remap, one that fell off the bus (XID 79: NVML then answers "GPU is lost" for nearly
// every field), one throttled for heat), not on a fake library pretending to be a GPU.
#include "metrics/gpu.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace tessera::metrics {
namespace {

GpuReading identity(int index) {
  GpuReading r;
  r.index = index;
  r.name = "NVIDIA H100 80GB HBM3";
  r.uuid = "GPU-8f3c2a1e-5b7d-4c9e-a2f1-0d6e4b3c" + std::to_string(1000 + index);
  r.pci_bus_id = "00000000:" + std::to_string(18 + index) + ":00.0";
  r.serial = "165012345678" + std::to_string(index);
  return r;
}

// Under load at its power cap (bit 0x4 set, normal for a busy GPU), no ECC history.
GpuReading healthy_under_load() {
  GpuReading r = identity(0);
  r.gpu_util_pct = 97, r.mem_copy_util_pct = 41;
  r.fb_used_mib = 71234, r.fb_free_mib = 10245;
  r.sm_clock_mhz = 1980, r.max_sm_clock_mhz = 1980, r.mem_clock_mhz = 2619;
  r.temperature_c = 61, r.power_w = 612.25, r.energy_mj = 8.25e9;
  r.throttle_reasons = throttle::kSwPowerCap;
  r.ecc_sbe_volatile = 0, r.ecc_dbe_volatile = 0, r.retired_pages_pending = 0;
  r.remapped_rows_uncorrectable = 0, r.remapped_rows_correctable = 0;
  r.row_remap_pending = false, r.row_remap_failure = false;
  return r;
}

GpuReading ecc_errors() {
  GpuReading r = healthy_under_load();
  r.index = 1;
  r.ecc_sbe_volatile = 14, r.ecc_dbe_volatile = 2;
  r.remapped_rows_uncorrectable = 1;
  r.row_remap_pending = true;
  return r;
}

GpuReading fallen_off_the_bus() {
  GpuReading r = identity(2);
  r.xid_count = 1, r.last_xid = 79;
  return r;
}

GpuReading thermal_throttle() {
  GpuReading r = healthy_under_load();
  r.index = 3;
  r.temperature_c = 92, r.sm_clock_mhz = 1005;
  r.throttle_reasons = throttle::kHwThermalSlowdown | throttle::kSwThermalSlowdown | throttle::kHwSlowdown;
  return r;
}

bool mentions(const GpuVerdict& v, const std::string& text) { return v.summary().find(text) != std::string::npos; }

TEST(GpuVerdict, HealthyUnderLoadAtItsPowerCap) {
  const GpuVerdict v = judge_gpu(healthy_under_load(), {85, 0.8});
  EXPECT_EQ(v.status, GpuStatus::kHealthy) << v.summary();
  EXPECT_EQ(v.summary(), "healthy");
}

TEST(GpuVerdict, UncorrectableEccAndAPendingRowRemapFail) {
  const GpuVerdict v = judge_gpu(ecc_errors());
  EXPECT_EQ(v.status, GpuStatus::kFailed);
  EXPECT_TRUE(mentions(v, "2 uncorrectable (double-bit) ECC errors")) << v.summary();
  EXPECT_TRUE(mentions(v, "row remap is pending")) << v.summary();
  GpuReading failed = ecc_errors();
  failed.row_remap_failure = true;
  EXPECT_TRUE(mentions(judge_gpu(failed), "row remapping failed")) << judge_gpu(failed).summary();
}

TEST(GpuVerdict, Xid79FailsAndNamesIt) {
  const GpuVerdict v = judge_gpu(fallen_off_the_bus());
  EXPECT_EQ(v.status, GpuStatus::kFailed);
  EXPECT_TRUE(mentions(v, "XID 79 (GPU has fallen off the bus)")) << v.summary();
  // An application's own fault (XID 13, graphics engine exception) is worth a warning only.
  GpuReading app = healthy_under_load();
  app.xid_count = 3, app.last_xid = 13;
  EXPECT_EQ(judge_gpu(app).status, GpuStatus::kDegraded) << judge_gpu(app).summary();
}

TEST(GpuVerdict, ThermalThrottleFails) {
  const GpuVerdict v = judge_gpu(thermal_throttle(), {85, 0.8});
  EXPECT_EQ(v.status, GpuStatus::kFailed);
  EXPECT_TRUE(mentions(v, "hardware thermal slowdown")) << v.summary();
  EXPECT_TRUE(mentions(v, "software thermal slowdown")) << v.summary();
  EXPECT_TRUE(mentions(v, "temperature 92 C above the limit 85 C")) << v.summary();
  EXPECT_TRUE(mentions(v, "SM clock 1005 MHz below 80%")) << v.summary();
  // Without the hardware bits, running hot is a warning.
  GpuReading warm = thermal_throttle();
  warm.throttle_reasons = throttle::kSwThermalSlowdown;
  EXPECT_EQ(judge_gpu(warm).status, GpuStatus::kDegraded) << judge_gpu(warm).summary();
  // An idle GPU's low clock is no finding.
  GpuReading idle = healthy_under_load();
  idle.sm_clock_mhz = 345, idle.throttle_reasons = throttle::kGpuIdle;
  EXPECT_EQ(judge_gpu(idle, {0, 0.8}).status, GpuStatus::kHealthy) << judge_gpu(idle, {0, 0.8}).summary();
}

TEST(GpuVerdict, DescribeNamesBusAndSerial) {
  EXPECT_EQ(describe_gpu(ecc_errors()),
            "GPU 1 (NVIDIA H100 80GB HBM3, PCI 00000000:18:00.0, serial 1650123456780, "
            "GPU-8f3c2a1e-5b7d-4c9e-a2f1-0d6e4b3c1000)");
}

// DCGM exporter's names, types and labels; fields NVML did not answer are left out, not zero.
TEST(GpuExposition, DcgmNamesLabelsAndTypes) {
  Exposition page;
  expose_gpus(page, {healthy_under_load(), fallen_off_the_bus()}, "node-7");
  const std::string text = page.text();
  const std::string labels0 =
      "{gpu=\"0\",UUID=\"GPU-8f3c2a1e-5b7d-4c9e-a2f1-0d6e4b3c1000\",pci_bus_id=\"00000000:18:00.0\","
      "device=\"nvidia0\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-7\"}";
  for (const std::string& sample :
       {"DCGM_FI_DEV_GPU_UTIL" + labels0 + " 97", "DCGM_FI_DEV_FB_USED" + labels0 + " 71234",
        "DCGM_FI_DEV_POWER_USAGE" + labels0 + " 612.25", "DCGM_FI_DEV_SM_CLOCK" + labels0 + " 1980",
        "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS" + labels0 + " 4", "DCGM_FI_DEV_XID_ERRORS" + labels0 + " 0",
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION" + labels0 + " 8250000000",
        std::string("# TYPE DCGM_FI_DEV_ECC_DBE_VOL_TOTAL counter"),
        std::string("# TYPE DCGM_FI_DEV_GPU_TEMP gauge")}) {
    EXPECT_NE(text.find(sample + "\n"), std::string::npos) << sample << "\n" << text;
  }
  // The lost GPU: its XID, and nothing it could not answer.
  EXPECT_NE(text.find("DCGM_FI_DEV_XID_ERRORS{gpu=\"2\""), std::string::npos) << text;
  EXPECT_NE(text.find("device=\"nvidia2\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-7\"} 79\n"),
            std::string::npos)
      << text;
  EXPECT_EQ(text.find("DCGM_FI_DEV_GPU_UTIL{gpu=\"2\""), std::string::npos) << text;
  // One family per name, its samples together.
  EXPECT_EQ(text.find("# TYPE DCGM_FI_DEV_XID_ERRORS"), text.rfind("# TYPE DCGM_FI_DEV_XID_ERRORS"));
}

TEST(GpuExposition, JsonHasOnlyAnsweredFields) {
  const auto good = gpu_json(healthy_under_load()), lost = gpu_json(fallen_off_the_bus());
  EXPECT_EQ(good["gpu_util_pct"], 97);
  EXPECT_EQ(good["throttle_reasons"], 4);
  EXPECT_EQ(good["row_remap_pending"], false);
  EXPECT_EQ(lost["last_xid"], 79);
  EXPECT_FALSE(lost.contains("gpu_util_pct"));
  EXPECT_FALSE(lost.contains("temperature_c"));
}

}  // namespace
}  // namespace tessera::metrics
