// GPU readings judged and exposed: see gpu.h.
#include "metrics/gpu.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

namespace tessera::metrics {
namespace {

// NVIDIA's XID catalogue: the codes it attributes to the hardware, its memory or the driver's
// firmware (a reset or service, not a code fix), with what each means.
struct HardwareXid {
  int code;
  const char* meaning;
};
constexpr HardwareXid kHardwareXids[] = {
    {48, "double-bit ECC error"},
    {61, "internal micro-controller breakpoint"},
    {62, "internal micro-controller halt"},
    {63, "ECC page retirement or row remap recorded"},
    {64, "ECC page retirement or row remap failed"},
    {74, "NVLink error"},
    {79, "GPU has fallen off the bus"},
    {92, "high single-bit ECC error rate"},
    {94, "contained ECC error"},
    {95, "uncontained ECC error"},
    {119, "GSP RPC timeout"},
    {120, "GSP error"},
    {140, "unrecovered ECC error"},
};

const char* hardware_xid(int code) {
  for (const HardwareXid& x : kHardwareXids) {
    if (x.code == code) return x.meaning;
  }
  return nullptr;
}

template <typename T>
std::optional<double> number(const std::optional<T>& x) {
  return x ? std::optional<double>(static_cast<double>(*x)) : std::nullopt;
}

void add(GpuVerdict& v, GpuStatus status, std::string what) {
  v.status = std::max(v.status, status);
  v.findings.push_back({status, std::move(what)});
}

}  // namespace

const char* gpu_status_name(GpuStatus status) {
  switch (status) {
    case GpuStatus::kHealthy:
      return "healthy";
    case GpuStatus::kDegraded:
      return "degraded";
    case GpuStatus::kFailed:
      return "failed";
  }
  return "?";
}

std::string GpuVerdict::summary() const {
  if (findings.empty()) return "healthy";
  std::string out;
  for (const GpuFinding& f : findings) {
    out += fmt::format("{}{}: {}", out.empty() ? "" : "; ", gpu_status_name(f.status), f.what);
  }
  return out;
}

GpuVerdict judge_gpu(const GpuReading& r, const GpuLimits& limits) {
  GpuVerdict v;
  if (r.ecc_dbe_volatile.value_or(0) > 0) {
    add(v, GpuStatus::kFailed,
        fmt::format("{} uncorrectable (double-bit) ECC errors since the driver loaded: drain the node and "
                    "reset the GPU",
                    *r.ecc_dbe_volatile));
  }
  if (r.retired_pages_pending.value_or(0) > 0) {
    add(v, GpuStatus::kFailed, "a memory page retirement is pending: reset the GPU before using it");
  }
  if (r.row_remap_failure.value_or(false)) {
    add(v, GpuStatus::kFailed, "row remapping failed: the GPU's memory needs service (RMA)");
  } else if (r.row_remap_pending.value_or(false)) {
    add(v, GpuStatus::kFailed, "a row remap is pending: reset the GPU before using it");
  }
  if (r.xid_count > 0) {
    if (const char* meaning = hardware_xid(r.last_xid)) {
      add(v, GpuStatus::kFailed,
          fmt::format("XID {} ({}), {} XID event(s) seen: drain the node and reset or service the GPU", r.last_xid,
                      meaning, r.xid_count));
    } else {
      add(v, GpuStatus::kDegraded,
          fmt::format("XID {}, {} XID event(s) seen (often an application fault; see NVIDIA's XID catalogue)",
                      r.last_xid, r.xid_count));
    }
  }
  if (r.throttle_reasons) {
    const uint64_t t = *r.throttle_reasons;
    if (t & throttle::kHwThermalSlowdown) add(v, GpuStatus::kFailed, "hardware thermal slowdown: check cooling");
    if (t & throttle::kHwPowerBrakeSlowdown) {
      add(v, GpuStatus::kFailed, "hardware power brake slowdown: check the power supply");
    }
    if ((t & throttle::kHwSlowdown) && !(t & (throttle::kHwThermalSlowdown | throttle::kHwPowerBrakeSlowdown))) {
      add(v, GpuStatus::kFailed, "hardware slowdown (clocks cut by half or more): check cooling and power");
    }
    if (t & throttle::kSwThermalSlowdown) add(v, GpuStatus::kDegraded, "software thermal slowdown: running hot");
  }
  if (limits.max_temperature_c > 0 && r.temperature_c && *r.temperature_c > limits.max_temperature_c) {
    add(v, GpuStatus::kDegraded,
        fmt::format("temperature {:.0f} C above the limit {:.0f} C", *r.temperature_c, limits.max_temperature_c));
  }
  const bool idle = r.throttle_reasons && (*r.throttle_reasons & throttle::kGpuIdle);
  if (limits.min_sm_clock_fraction > 0 && !idle && r.sm_clock_mhz && r.max_sm_clock_mhz && *r.max_sm_clock_mhz > 0 &&
      *r.sm_clock_mhz < limits.min_sm_clock_fraction * *r.max_sm_clock_mhz) {
    add(v, GpuStatus::kDegraded,
        fmt::format("SM clock {:.0f} MHz below {:.0f}% of its maximum {:.0f} MHz", *r.sm_clock_mhz,
                    100 * limits.min_sm_clock_fraction, *r.max_sm_clock_mhz));
  }
  return v;
}

std::string describe_gpu(const GpuReading& r) {
  std::string out = fmt::format("GPU {} ({}", r.index, r.name.empty() ? "unnamed" : r.name);
  if (!r.pci_bus_id.empty()) out += ", PCI " + r.pci_bus_id;
  if (!r.serial.empty()) out += ", serial " + r.serial;
  if (!r.uuid.empty()) out += ", " + r.uuid;
  return out + ")";
}

void expose_gpus(Exposition& page, const std::vector<GpuReading>& readings, const std::string& hostname) {
  // DCGM exporter's field names, types, units and help texts (its default counters).
  struct Field {
    const char* name;
    const char* help;
    bool counter;
    std::optional<double> (*get)(const GpuReading&);
  };
  static const Field kFields[] = {
      {"DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", false, [](const GpuReading& r) { return r.gpu_util_pct; }},
      {"DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", false,
       [](const GpuReading& r) { return r.mem_copy_util_pct; }},
      {"DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", false,
       [](const GpuReading& r) { return r.fb_used_mib; }},
      {"DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", false,
       [](const GpuReading& r) { return r.fb_free_mib; }},
      {"DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", false,
       [](const GpuReading& r) { return r.sm_clock_mhz; }},
      {"DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", false,
       [](const GpuReading& r) { return r.mem_clock_mhz; }},
      {"DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", false, [](const GpuReading& r) { return r.temperature_c; }},
      {"DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", false, [](const GpuReading& r) { return r.power_w; }},
      {"DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "Total energy consumption since boot (in mJ).", true,
       [](const GpuReading& r) { return r.energy_mj; }},
      {"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "Current clock throttle reasons (NVML's bit mask).", false,
       [](const GpuReading& r) { return number(r.throttle_reasons); }},
      {"DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.", false,
       [](const GpuReading& r) { return std::optional<double>(r.last_xid); }},
      {"DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", true,
       [](const GpuReading& r) { return number(r.ecc_sbe_volatile); }},
      {"DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", true,
       [](const GpuReading& r) { return number(r.ecc_dbe_volatile); }},
      {"DCGM_FI_DEV_RETIRED_PENDING", "Total number of pages pending retirement.", true,
       [](const GpuReading& r) { return number(r.retired_pages_pending); }},
      {"DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for uncorrectable errors", true,
       [](const GpuReading& r) { return number(r.remapped_rows_uncorrectable); }},
      {"DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "Number of remapped rows for correctable errors", true,
       [](const GpuReading& r) { return number(r.remapped_rows_correctable); }},
      {"DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", false,
       [](const GpuReading& r) { return number(r.row_remap_failure); }},
  };
  // The page keeps a family's samples together whatever the order they are added in.
  for (const GpuReading& r : readings) {
    const Labels labels = {{"gpu", std::to_string(r.index)},
                           {"UUID", r.uuid},
                           {"pci_bus_id", r.pci_bus_id},
                           {"device", "nvidia" + std::to_string(r.index)},
                           {"modelName", r.name},
                           {"Hostname", hostname}};
    for (const Field& f : kFields) {
      const std::optional<double> value = f.get(r);
      if (!value) continue;
      if (f.counter) {
        page.counter_named_elsewhere(f.name, f.help, *value, labels);
      } else {
        page.gauge(f.name, f.help, *value, labels);
      }
    }
  }
}

nlohmann::ordered_json gpu_json(const GpuReading& r) {
  nlohmann::ordered_json g = {
      {"index", r.index}, {"uuid", r.uuid}, {"xid_count", r.xid_count}, {"last_xid", r.last_xid}};
  auto put = [&](const char* key, const auto& field) {
    if (field) g[key] = *field;
  };
  put("gpu_util_pct", r.gpu_util_pct);
  put("mem_copy_util_pct", r.mem_copy_util_pct);
  put("fb_used_mib", r.fb_used_mib);
  put("fb_free_mib", r.fb_free_mib);
  put("sm_clock_mhz", r.sm_clock_mhz);
  put("mem_clock_mhz", r.mem_clock_mhz);
  put("temperature_c", r.temperature_c);
  put("power_w", r.power_w);
  put("throttle_reasons", r.throttle_reasons);
  put("ecc_sbe_volatile", r.ecc_sbe_volatile);
  put("ecc_dbe_volatile", r.ecc_dbe_volatile);
  put("row_remap_pending", r.row_remap_pending);
  put("row_remap_failure", r.row_remap_failure);
  return g;
}

}  // namespace tessera::metrics
