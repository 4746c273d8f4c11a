// The health check every rank runs before step 0 (ARCHITECTURE.md, launcher and resilience):
// a known all-reduce checked exactly, its bandwidth, a small GEMM on the rank's compute backend
// against the reference kernels and, on a GPU, its device memory bandwidth against a floor and
// NVML's view of it (metrics::judge_gpu: ECC, row remapping, XID events, hardware slowdown), so
// that a broken rank is named before the job spends time training.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "config/config.h"
#include "kernels/backend.h"
#include "metrics/gpu.h"
#include "train/trainer.h"

namespace tessera::train {

// What one rank found.
struct HealthFigures {
  bool all_reduce_ok = true;  // integer-valued all-reduce exactly equal to its known sum
  bool gemm_ok = true;        // the backend's GEMM within the K-derived bound of the ref GEMM
  bool gpu_ok = true;         // no failed GPU verdict (or no GPU)
  bool memory_ok = true;      // device memory bandwidth at or above parallel.health_min_memory_gbps
  double memory_gbps = 0.0;   // a device-to-device copy's bytes read + written per second (0 on the CPU)
  double gemm_worst = 0.0;    // largest |cpu - ref| / tolerance over the GEMM's outputs
  double bus_gbps = 0.0;      // all-reduce bus bandwidth, 2 (W-1)/W x bytes / time (0 at W = 1)
  int64_t bus_bytes = 0;      // the bytes it was measured on (4 MiB over Gloo, 64 MiB over NCCL)
  double seconds = 0.0;       // the whole check
};

// Runs the checks on this rank; a collective over dist.world (every rank calls it once; a single
// process checks the GEMM and its GPU only). Every rank learns every rank's verdict through
// all-gathers, so all of them throw the same HealthError naming the failing rank(s) and checks,
// a failing GPU by host, PCI bus id and serial (exit code 4, never restarted); rank 0 logs the
// figures. `backend`: where the rank computes (the GEMM runs there; on a device, the memory
// bandwidth is measured). `gpu`: this rank's GPU reading (ComputeDevice::gpu_reading). Fault
// point "health": kind fail corrupts this rank's GEMM result, kind gpu adds XID 79 to its GPU
// reading. Returns this rank's figures and, in `bus_gbps_per_rank`, every rank's.
HealthFigures health_check(const parallel::Distributed& dist, const config::Config& config,
                           kernels::Backend& backend = kernels::cpu_backend(),
                           const std::optional<metrics::GpuReading>& gpu = std::nullopt,
                           std::vector<double>* bus_gbps_per_rank = nullptr);

}  // namespace tessera::train
