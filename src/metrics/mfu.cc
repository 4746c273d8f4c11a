#include "metrics/mfu.h"

#include <algorithm>
#include <vector>

#include "core/bf16.h"
#include "core/timer.h"
#include "kernels/cpu/matmul.h"

namespace tessera::metrics {

std::optional<double> gpu_peak_flops(std::string_view device_name, std::string_view dtype) {
  // Dense (no sparsity) figures from the vendors' datasheets, SXM/OAM parts unless named.
  struct Row {
    std::string_view match;  // a substring of the CUDA device name
    double bf16, fp32, tf32;  // tf32: 0 where not listed here
  };
  static constexpr Row kTable[] = {
      {"B200", 2250e12, 80e12, 0},       {"H200", 989.4e12, 66.9e12, 494.7e12}, {"H100 PCIe", 756.5e12, 51.2e12, 0},
      {"H100 NVL", 835.5e12, 60e12, 0},  {"H100", 989.4e12, 66.9e12, 494.7e12}, {"GH200", 989.4e12, 66.9e12, 494.7e12},
      {"A100", 312e12, 19.5e12, 156e12}, {"L40S", 362.05e12, 91.6e12, 0},       {"L4", 121e12, 30.3e12, 0},
      {"A10G", 70e12, 35e12, 0},         {"RTX 4090", 165.2e12, 82.6e12, 0},
  };
  if (dtype != "bf16" && dtype != "fp32" && dtype != "tf32") return std::nullopt;
  for (const Row& row : kTable) {
    if (device_name.find(row.match) == std::string_view::npos) continue;
    const double peak = dtype == "bf16" ? row.bf16 : dtype == "fp32" ? row.fp32 : row.tf32;
    return peak > 0 ? std::optional<double>(peak) : std::nullopt;
  }
  return std::nullopt;
}

double calibrate_cpu_peak(std::string_view dtype, double seconds, int64_t n) {
  const bool bf16 = dtype == "bf16";
  const size_t count = static_cast<size_t>(n * n);
  std::vector<float> a(count), b(count), c(count);
  std::vector<uint16_t> a16(bf16 ? count : 0), b16(bf16 ? count : 0);
  for (size_t i = 0; i < count; ++i) {  // small values, no denormals
    a[i] = static_cast<float>(i % 7) * 0.125f - 0.375f;
    b[i] = static_cast<float>(i % 5) * 0.25f - 0.5f;
  }
  if (bf16) {
    f32_to_bf16(a.data(), a16.data(), n * n);
    f32_to_bf16(b.data(), b16.data(), n * n);
  }
  auto once = [&] {
    if (bf16) {
      kernels::cpu::gemm_bf16(false, false, n, n, n, 1.0f, a16.data(), n, b16.data(), n, 0.0f, c.data(), n);
    } else {
      kernels::cpu::gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    }
  };
  once();  // warm-up: primitive creation, page faults, clocks
  const double flops = 2.0 * static_cast<double>(n) * static_cast<double>(n) * static_cast<double>(n);
  double best = 0.0;
  const double start = now_seconds();
  for (int i = 0; i < 3 || now_seconds() - start < seconds; ++i) {
    const double t0 = now_seconds();
    once();
    best = std::max(best, flops / (now_seconds() - t0));
  }
  return best;
}

}  // namespace tessera::metrics
