// The peak FLOP/s that MFU is measured against (docs/metrics.md, "What MFU counts").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace tessera::metrics {

// Dense datasheet peak of a GPU, found by its CUDA device name (e.g. "NVIDIA H100 80GB HBM3"),
// for "bf16" (tensor cores), "fp32" (CUDA cores) or "tf32" (tensor cores, fp32 GEMMs with
// model.allow_tf32); nullopt for a device or precision not in the table.
std::optional<double> gpu_peak_flops(std::string_view device_name, std::string_view dtype);

// The best FLOP/s of repeated n x n x n GEMMs in `dtype` ("fp32", or "bf16": bf16 in, fp32
// out) on this process's threads, over about `seconds` after a warm-up.
double calibrate_cpu_peak(std::string_view dtype, double seconds = 0.2, int64_t n = 1024);

// A job's peak: the sum over ranks, and where it came from ("measured: ...", "configured: ...").
struct Peak {
  double flops_per_s = 0.0;  // 0: unknown, no MFU
  std::string source;
  bool known() const { return flops_per_s > 0.0; }
};

// Model FLOP/s as a fraction of the peak; nullopt without one.
inline std::optional<double> mfu(double model_flops_per_s, const Peak& peak) {
  if (!peak.known()) return std::nullopt;
  return model_flops_per_s / peak.flops_per_s;
}

}  // namespace tessera::metrics
