// GPU telemetry (issue 17): one sample of a GPU as NVML reports it, the verdict an operator draws
// from it, and its exposition under the names NVIDIA's DCGM exporter gives the same fields, so
// dashboards and alerts written for DCGM read Tessera's endpoint unchanged (the mapping:
// docs/metrics.md). Pure functions of a reading, tested on recorded readings
// (metrics/gpu_test.cc); metrics/nvml.h takes readings from the driver.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "metrics/prometheus.h"

namespace tessera::metrics {

// NVML's clocks-event ("throttle") reason bits, nvmlClocksEventReason* in nvml.h.
namespace throttle {
constexpr uint64_t kGpuIdle = 0x1;
constexpr uint64_t kApplicationsClocksSetting = 0x2;
constexpr uint64_t kSwPowerCap = 0x4;
constexpr uint64_t kHwSlowdown = 0x8;
constexpr uint64_t kSyncBoost = 0x10;
constexpr uint64_t kSwThermalSlowdown = 0x20;
constexpr uint64_t kHwThermalSlowdown = 0x40;
constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
constexpr uint64_t kDisplayClockSetting = 0x100;
}  // namespace throttle

// One GPU at one moment. A field NVML did not answer (not supported on this GPU, or not
// permitted) stays empty and is neither judged nor exposed.
struct GpuReading {
  int index = 0;  // NVML's device index
  std::string name, uuid, pci_bus_id, serial;
  std::optional<double> gpu_util_pct, mem_copy_util_pct;  // over the driver's last sample period
  std::optional<double> fb_used_mib, fb_free_mib;
  std::optional<double> sm_clock_mhz, max_sm_clock_mhz, mem_clock_mhz;
  std::optional<double> temperature_c, power_w;
  std::optional<double> energy_mj;           // since the driver loaded
  std::optional<uint64_t> throttle_reasons;  // throttle:: bits
  // ECC errors since the driver loaded (volatile): single-bit corrected, double-bit uncorrected.
  std::optional<uint64_t> ecc_sbe_volatile, ecc_dbe_volatile;
  std::optional<uint64_t> retired_pages_pending;  // pages waiting for a reset to be retired (pre-A100)
  // Row remapping (A100 and later): rows remapped for uncorrectable and correctable errors, a
  // remap waiting for a reset, a remap that failed.
  std::optional<uint64_t> remapped_rows_uncorrectable, remapped_rows_correctable;
  std::optional<bool> row_remap_pending, row_remap_failure;
  // XID events the sampler has seen on this GPU since it started, and the last one's code.
  uint64_t xid_count = 0;
  int last_xid = 0;
};

enum class GpuStatus { kHealthy, kDegraded, kFailed };  // degraded: worth a warning, not a stop
const char* gpu_status_name(GpuStatus status);

struct GpuFinding {
  GpuStatus status;
  std::string what;  // names the field and its value, and what an operator does about it
};

struct GpuVerdict {
  GpuStatus status = GpuStatus::kHealthy;  // the worst finding's
  std::vector<GpuFinding> findings;
  std::string summary() const;  // the findings joined; "healthy" with none
};

// Floors an operator may set (zero: not checked).
struct GpuLimits {
  double max_temperature_c = 0;
  double min_sm_clock_fraction = 0;  // of max_sm_clock_mhz, while the GPU is not idle
};

// Failed: uncorrectable ECC errors, a page retirement or row remap pending (the GPU needs a
// reset), a row remap failure (it needs service), an XID that NVIDIA's XID catalogue attributes to
// the hardware or driver (48, 61-64, 74, 79, 92, 94, 95, 119, 120, 140), hardware slowdown (thermal,
// power brake, or the generic HW slowdown). Degraded: other XIDs (often the application's own
// faults, e.g. 13, 31, 43), software thermal slowdown, a limit above exceeded.
GpuVerdict judge_gpu(const GpuReading& r, const GpuLimits& limits = {});

// "GPU 3 (NVIDIA H200, 00000000:19:00.0, serial 1650123456789, GPU-...)": how errors name a GPU.
std::string describe_gpu(const GpuReading& r);

// DCGM exporter's families (DCGM_FI_DEV_*), one sample per reading, with its labels: gpu, UUID,
// pci_bus_id, device (nvidiaN), modelName, Hostname.
void expose_gpus(Exposition& page, const std::vector<GpuReading>& readings, const std::string& hostname);

// The reading's answered fields as a JSON object, for metrics.jsonl (key "gpu").
nlohmann::ordered_json gpu_json(const GpuReading& r);

}  // namespace tessera::metrics
