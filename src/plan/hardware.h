// Layer plan: what a run will need and how fast it will go, on any hardware, before running
// anything (docs/plan.md). It calls the functions that size the real arenas (fsdp, optim, model),
// never allocating them, and counts collectives' bytes by the formulas the FsdpBytes tests check.
//
// The hardware a plan is for: one node's devices, their memory, compute and links. Every figure
// is a stated assumption with its source (docs/plan.md, "Hardware"); nothing else in the model
// is tuned.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/model_config.h"

namespace tessera::plan {

struct Hardware {
  std::string name;         // "h100-80gb", "cpu", or a custom table's name
  std::string description;  // the part and the node it comes in
  int devices_per_node = 8;
  uint64_t memory_bytes = 0;    // per device
  uint64_t reserved_bytes = 0;  // per device, before the run's own memory: CUDA context, NCCL and
                                // library workspaces; on a CPU, the process's baseline
  double peak_bf16 = 0.0;       // dense datasheet FLOP/s per device
  double peak_fp32 = 0.0;
  double gemm_efficiency = 1.0;       // fraction of the peak that training-shaped GEMMs reach
  double attention_efficiency = 1.0;  // and causal attention, forward and backward, in the FLOPs
                                      // MFU counts for it (12 T C per token and block)
  double memory_bandwidth = 0.0;      // bytes/s per device: what memory-bound kernels stream
  double intra_bandwidth = 0.0;       // bytes/s per device, one direction, collectives inside a node
  double intra_latency = 0.0;         // s per ring step inside a node
  double inter_bandwidth = 0.0;       // bytes/s per node, one direction, between nodes (all its NICs)
  double inter_latency = 0.0;         // s per ring step between nodes
  double kernel_overhead = 0.0;       // s per kernel: a GPU's launch, a CPU's fork and join of its threads
  double unit_overhead = 0.0;         // s per unit and step beyond the modelled work (measured on a CPU)
  bool calibrated = false;            // measured on this machine (the `cpu` preset)
  bool gloo = false;                  // collectives over Gloo (the CPU), else NCCL
  std::string source;                 // where the figures come from

  double peak(bool bf16) const { return bf16 ? peak_bf16 : peak_fp32; }
};

// The built-in tables (a100-40gb, a100-80gb, h100-80gb, h200) by name; nullptr if unknown.
const Hardware* hardware_preset(const std::string& name);
std::vector<std::string> hardware_names();  // the presets and "cpu"

// A custom table: a TOML file with the keys of Hardware (docs/plan.md shows one). ConfigError
// (exit 2) naming the file and the key for a missing, unknown or out-of-range value.
Hardware load_hardware(const std::string& path);

// `cpu`: this machine measured, for ranks of `threads` threads each, with the kernels training
// runs: the GEMM rate per precision (as the MFU peak is measured) and what the model's GEMM
// shapes reach of it, the attention kernels' rate at the model's sequence length and head size,
// AdamW's bytes per second (the memory-bound rate),
// the fork and join of the threads, and Gloo's all-gather bandwidth and latency between two ranks
// over loopback; memory from /proc/meminfo, shared by the `ranks` ranks (the job's ranks on this
// machine, which run at once and are measured so). gemm_efficiency is measured in the plan's
// precision at the model's shapes. reserved_bytes is left 0: a process's baseline (code,
// libraries, threads, JIT kernels, the MFU calibration's buffers) is what a real run measures,
// which the caller does (`tessera plan` runs a one-layer bench). About two seconds.
Hardware calibrate_cpu(int ranks, int threads, const model::ModelConfig& model, bool bf16);

// By name: a preset or a path to a TOML table ("cpu" is calibrate_cpu's). ConfigError (exit 2)
// naming --hardware and the known names otherwise.
Hardware resolve_hardware(const std::string& name_or_path);

}  // namespace tessera::plan
