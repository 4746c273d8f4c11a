// What a checkpoint saves of a rank and restores into it: where training stands (TrainingState)
// and this rank's shards of the parameters and optimizer state (RankShards).
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.h"
#include "model/layout.h"
#include "parallel/shard_range.h"

namespace tessera::checkpoint {

// Where training stands after a step: what a checkpoint records besides parameters and moments.
struct TrainingState {
  int64_t step = 0;               // optimizer steps taken, skipped ones included (schedule, data)
  int64_t tokens = 0;             // training tokens seen
  uint64_t sampler_position = 0;  // global position of the next batch's first sample
  int64_t optimizer_steps = 0;    // AdamW updates applied: step less the skipped ones (bias correction)
};

// This rank's part of the parameters and optimizer state, as a checkpoint saves and restores it:
// for each unit of the layout, the elements `range` of its padded buffer in three fp32 arrays
// that the owner keeps (fsdp's master shard, optim's moments) and that outlive the view, in the
// memory of `backend` (a GPU's with train.device = cuda): saving copies them out through it,
// loading in.
struct UnitShard {
  parallel::ShardRange range;
  float* param = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
};
struct RankShards {
  const model::ModelLayout* layout = nullptr;
  std::vector<UnitShard> units;  // one per unit of *layout
  kernels::Backend* backend = &kernels::cpu_backend();
};

}  // namespace tessera::checkpoint
