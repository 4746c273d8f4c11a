// Step time per rank: compute from the FLOPs MFU counts over the hardware's GEMM rate,
// memory-bound passes over its memory bandwidth, and every collective from its bytes over ring
// bandwidth and latency, overlapped with compute the way the engine orders them (prefetch one
// unit ahead, reduce-scatters behind the backward), plus the pipeline bubble (docs/plan.md).
#pragma once

#include <cstdint>
#include <string>

#include "config/config.h"
#include "parallel/parallel_dims.h"
#include "plan/hardware.h"

namespace tessera::plan {

// Where the ranks sit: `devices_per_node` ranks on each of `nodes` nodes, in the mesh's rank order
// (tp innermost, then dp_shard, dp_replicate, pp).
struct Cluster {
  Hardware hardware;
  int nodes = 1;
  int devices_per_node = 1;
  int world() const { return nodes * devices_per_node; }
};

struct StepPlan {
  double step_s = 0.0;
  double compute_s = 0.0;       // GEMMs and attention of every micro-batch (recompute included)
  double memory_bound_s = 0.0;  // norms, RoPE, SwiGLU, the loss's softmax, residuals
  double overhead_s = 0.0;      // per-kernel launch and synchronization
  double runtime_s = 0.0;       // per-unit runtime costs (Hardware::unit_overhead)
  double optimizer_s = 0.0;     // AdamW, the gradient norm, zeroing
  double dp_comm_s = 0.0;       // FSDP / DDP collectives in all, and the part compute does not hide:
  double dp_exposed_s = 0.0;
  double tp_comm_s = 0.0;  // tensor-parallel collectives (never hidden)
  double pp_comm_s = 0.0;  // pipeline sends (never hidden)
  double bubble = 0.0;     // (P - 1) / (m + P - 1)
  double bubble_s = 0.0;
  double tokens_per_s = 0.0;  // the whole job
  double tokens_per_s_per_device = 0.0;
  double mfu = 0.0;  // model FLOP/s over the devices' datasheet (or measured) peak
  int slowest_stage = 0;
};

// The step of `config` as `dims` on `cluster` (config.parallel.nproc == dims.world() ==
// cluster.world(); the micro-batch and accumulation are the config's).
StepPlan step_plan(const config::Config& config, const parallel::ParallelDims& dims, const Cluster& cluster);

// Ring collectives over n ranks (NCCL's and Gloo's algorithm for large messages): seconds to
// all-gather or reduce-scatter `bytes` (the whole, gathered size), and to all-reduce them.
double ring_gather_seconds(double bytes, int n, double bandwidth, double latency);
double ring_all_reduce_seconds(double bytes, int n, double bandwidth, double latency);

}  // namespace tessera::plan
