#include "plan/hardware.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <vector>

#include "core/error.h"

namespace tessera::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

// Datasheet figures (docs/plan.md, "Hardware", gives each source). Bandwidths are what NCCL's
// own tests reach (bus bandwidth), not line rates; memory bandwidth is 85% of the datasheet's
// (what streaming kernels reach); gemm_efficiency is what cuBLAS reaches on training-shaped
// bf16 GEMMs.
Hardware gpu(std::string name, std::string description, double memory_mib, double hbm, double peak_bf16,
             double peak_fp32, double gemm_efficiency, double attention_efficiency, double nvlink_busbw,
             double node_network) {
  Hardware h;
  h.name = std::move(name);
  h.description = std::move(description);
  h.devices_per_node = 8;
  h.memory_bytes = static_cast<uint64_t>(memory_mib * kMiB);
  h.reserved_bytes = static_cast<uint64_t>(1.5 * kGiB);
  h.peak_bf16 = peak_bf16;
  h.peak_fp32 = peak_fp32;
  h.gemm_efficiency = gemm_efficiency;
  h.attention_efficiency = attention_efficiency;
  h.memory_bandwidth = 0.85 * hbm;
  h.intra_bandwidth = nvlink_busbw;
  h.intra_latency = 8e-6;
  h.inter_bandwidth = node_network;
  h.inter_latency = 20e-6;
  h.kernel_overhead = 4e-6;
  h.source = "datasheet (docs/plan.md, Hardware)";
  return h;
}

const std::vector<Hardware>& presets() {
  static const std::vector<Hardware> table = {
      gpu("a100-40gb", "8 x A100 SXM4 40 GB per node (p4d), NVLink 3, 400 Gb/s EFA", 40536, 1555e9, 312e12, 19.5e12,
          0.70, 0.55, 230e9, 40e9),
      gpu("a100-80gb", "8 x A100 SXM4 80 GB per node (p4de), NVLink 3, 400 Gb/s EFA", 81920, 2039e9, 312e12, 19.5e12,
          0.70, 0.55, 230e9, 40e9),
      gpu("h100-80gb", "8 x H100 SXM5 80 GB per node (p5), NVLink 4, 3200 Gb/s EFA", 81559, 3350e9, 989.4e12, 66.9e12,
          0.55, 0.35, 360e9, 320e9),
      gpu("h200", "8 x H200 SXM 141 GB per node (p5e), NVLink 4, 3200 Gb/s EFA", 143771, 4800e9, 989.4e12, 66.9e12,
          0.55, 0.35, 360e9, 320e9),
  };
  return table;
}

}  // namespace

const Hardware* hardware_preset(const std::string& name) {
  for (const Hardware& h : presets()) {
    if (h.name == name) return &h;
  }
  return nullptr;
}

std::vector<std::string> hardware_names() {
  std::vector<std::string> names;
  for (const Hardware& h : presets()) names.push_back(h.name);
  names.emplace_back("cpu");
  return names;
}

Hardware load_hardware(const std::string& path) {
  toml::table t;
  try {
    t = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw ConfigError(fmt::format("hardware table {}: {} (line {})", path, e.description(), e.source().begin.line));
  }
  Hardware h;
  h.name = std::filesystem::path(path).stem().string();
  h.source = path;
  struct Key {
    const char* name;
    double* number;
    double lo;
  };
  double devices = 8, memory_gib = 0, reserved_gib = 1.5, peak_bf16 = 0, peak_fp32 = 0, memory_gbs = 0, intra_gbs = 0,
         intra_us = 8, inter_gbs = 0, inter_us = 20, efficiency = 1, kernel_us = 4, attention = 0;
  const Key keys[] = {
      {"devices_per_node", &devices, 1},       {"memory_gib", &memory_gib, 0},
      {"reserved_gib", &reserved_gib, 0},      {"peak_bf16_tflops", &peak_bf16, 0},
      {"peak_fp32_tflops", &peak_fp32, 0},     {"gemm_efficiency", &efficiency, 0},
      {"attention_efficiency", &attention, 0}, {"memory_gbs", &memory_gbs, 0},
      {"intra_node_gbs", &intra_gbs, 0},       {"intra_node_latency_us", &intra_us, 0},
      {"inter_node_gbs", &inter_gbs, 0},       {"inter_node_latency_us", &inter_us, 0},
      {"kernel_overhead_us", &kernel_us, 0},
  };
  for (const auto& [key, value] : t) {
    const std::string k(key.str());
    if (k == "name" || k == "description") {
      if (!value.is_string()) throw ConfigError(fmt::format("hardware table {}: {} must be a string", path, k));
      (k == "name" ? h.name : h.description) = *value.value<std::string>();
      continue;
    }
    const Key* found = nullptr;
    for (const Key& candidate : keys) {
      if (k == candidate.name) found = &candidate;
    }
    if (found == nullptr) {
      std::vector<std::string> known = {"name", "description"};
      for (const Key& candidate : keys) known.emplace_back(candidate.name);
      throw ConfigError(fmt::format("hardware table {}: unknown key {} (known: {})", path, k, fmt::join(known, ", ")));
    }
    const std::optional<double> v = value.value<double>();
    if (!v || !(*v >= found->lo)) {
      throw ConfigError(fmt::format("hardware table {}: {} must be a number >= {}", path, k, found->lo));
    }
    *found->number = *v;
  }
  const char* required[] = {"memory_gib", "peak_bf16_tflops", "peak_fp32_tflops",
                            "memory_gbs", "intra_node_gbs",   "inter_node_gbs"};
  for (const char* k : required) {
    if (!t.contains(k)) throw ConfigError(fmt::format("hardware table {}: key {} is missing", path, k));
  }
  for (const char* k : required) {
    if (!(*t[k].value<double>() > 0)) throw ConfigError(fmt::format("hardware table {}: {} must be > 0", path, k));
  }
  if (efficiency <= 0 || efficiency > 1 || attention > 1) {
    throw ConfigError(
        fmt::format("hardware table {}: gemm_efficiency and attention_efficiency must be in (0, 1]", path));
  }
  h.devices_per_node = static_cast<int>(devices);
  h.memory_bytes = static_cast<uint64_t>(memory_gib * kGiB);
  h.reserved_bytes = static_cast<uint64_t>(reserved_gib * kGiB);
  h.peak_bf16 = peak_bf16 * 1e12;
  h.peak_fp32 = peak_fp32 * 1e12;
  h.gemm_efficiency = efficiency;
  h.attention_efficiency = attention > 0 ? attention : efficiency;  // unset: as fast as the GEMMs
  h.memory_bandwidth = memory_gbs * 1e9;
  h.intra_bandwidth = intra_gbs * 1e9;
  h.intra_latency = intra_us * 1e-6;
  h.inter_bandwidth = inter_gbs * 1e9;
  h.inter_latency = inter_us * 1e-6;
  h.kernel_overhead = kernel_us * 1e-6;
  return h;
}

Hardware resolve_hardware(const std::string& name_or_path) {
  if (const Hardware* h = hardware_preset(name_or_path)) return *h;
  if (name_or_path.ends_with(".toml")) {
    if (!std::filesystem::exists(name_or_path)) {
      throw ConfigError(fmt::format("--hardware {}: no such file", name_or_path));
    }
    return load_hardware(name_or_path);
  }
  throw ConfigError(fmt::format("--hardware {}: unknown hardware (known: {}; or a .toml table, docs/plan.md)",
                                name_or_path, fmt::join(hardware_names(), ", ")));
}

}  // namespace tessera::plan
