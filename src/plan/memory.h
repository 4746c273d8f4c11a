// Memory per rank, from the arithmetic that sizes the real arenas (fsdp::ShardedParams,
// optim::AdamW, model::Llama), so `tessera plan`, `tessera train`'s start-up line and the
// allocation agree to the byte (plan_test checks it against a Trainer's arenas).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "config/config.h"
#include "model/layout.h"
#include "parallel/parallel_dims.h"
#include "plan/hardware.h"

namespace tessera::plan {

struct MemoryPlan {
  int stage = 0;                // pipeline stage (every tp and dp rank of a stage holds the same)
  uint64_t params = 0;          // fp32 master shards, with alignment and bf16 companions or images
  uint64_t grads = 0;           // fp32 gradient shards
  uint64_t optimizer = 0;       // AdamW's two moments
  uint64_t buffers = 0;         // full-unit parameter and gradient buffers (prefetch depth, accumulation)
  uint64_t comm_workspace = 0;  // the host groups' own: shared-memory segments, Gloo's exchange buffer
  uint64_t activations = 0;     // every micro-batch in flight: saved activations and workspaces
  int activation_slots = 1;     // micro-batches in flight (the pipeline schedule's peak)
  uint64_t reserved = 0;        // the hardware's runtime baseline (Hardware::reserved_bytes)

  uint64_t arenas() const { return params + grads + optimizer + buffers + activations; }
  uint64_t total() const { return arenas() + comm_workspace + reserved; }
};

// One plan per pipeline stage for `config` laid out as `dims` (config.parallel.nproc must be
// dims.world(): the micro-batch and accumulation are the config's) on `hardware`, ranks of
// `threads` threads (the CPU attention workspace is per thread).
std::vector<MemoryPlan> memory_plans(const config::Config& config, const parallel::ParallelDims& dims, int threads,
                                     const Hardware& hardware);
// The layout a rank of pipeline stage `stage` trains with, as the Trainer builds it (tp rank 0:
// every tp rank's blocks are the same size).
model::ModelLayout stage_layout(const config::Config& config, const parallel::ParallelDims& dims, int stage);

// The stage that needs the most.
MemoryPlan peak_memory_plan(const std::vector<MemoryPlan>& plans);

// "1.23 GiB" / "456.7 MiB".
std::string format_bytes(double bytes);

}  // namespace tessera::plan
