// The parallel dimensions of a job (ARCHITECTURE.md, "Parallel dimensions") and the rank
// arithmetic of their layout: which coordinate a rank has in each dimension and which ranks share
// a group. Pure arithmetic, no communication: `Mesh` (mesh.h) builds the process groups on it.
//
// Rank order, outermost first: pp, dp_replicate, dp_shard, tp; tp is innermost, so the ranks of a
// tensor-parallel group are consecutive and land on one node, where the links are fastest (it
// communicates on every block, twice per pass); the data-parallel shard group comes next (an
// all-gather per unit), replicas after it (one all-reduce per step) and pipeline stages outermost
// (point-to-point activations, the least traffic), as Megatron-LM and torchtitan order them.
//   rank = ((pp_i * dp_replicate + dpr_i) * dp_shard + dps_i) * tp + tp_i
#pragma once

#include <string>
#include <vector>

namespace tessera::config {
struct Config;
}

namespace tessera::parallel {

enum class Dim {
  kWorld,        // every rank
  kDp,           // data parallel: dp_replicate x dp_shard (the ranks with this rank's pp and tp)
  kDpShard,      // the ranks a unit's parameters are sharded over (FSDP)
  kDpReplicate,  // the ranks holding the same shard (hybrid sharding's replicas, DDP)
  kTp,           // tensor parallel
  kPp,           // pipeline stages
};
constexpr Dim kAllDims[] = {Dim::kWorld, Dim::kDp, Dim::kDpShard, Dim::kDpReplicate, Dim::kTp, Dim::kPp};
const char* name(Dim d);  // "world", "dp", "dp_shard", "dp_replicate", "tp", "pp"

struct ParallelDims {
  int pp = 1, dp_replicate = 1, dp_shard = 1, tp = 1;

  int world() const { return pp * dp_replicate * dp_shard * tp; }
  int dp() const { return dp_replicate * dp_shard; }
  int size(Dim d) const;
  // Throws ConfigError (exit 2) unless every size is >= 1 and their product is `world`, naming the
  // keys and the numbers.
  void validate(int world) const;
  // "pp 1 x dp_replicate 2 x dp_shard 4 x tp 1 = 8 ranks"
  std::string to_string() const;
  bool operator==(const ParallelDims& o) const {
    return pp == o.pp && dp_replicate == o.dp_replicate && dp_shard == o.dp_shard && tp == o.tp;
  }
};

// The dimensions a config asks for at `world` ranks: tp = parallel.tensor, pp =
// parallel.pipeline, dp = world / (pp x tp), and
// parallel.strategy fills the data-parallel ones (full_shard and shard_grad_op: dp_shard = dp;
// hybrid_shard: dp_replicate x dp_shard with dp_shard = parallel.shard_group_size, 0 meaning all;
// no_shard: dp_replicate = dp). Validated.
ParallelDims dims_for(const config::Config& config, int world);

// This rank's coordinate in dimension d: its rank inside its group of that dimension.
int coordinate(const ParallelDims& dims, int rank, Dim d);
// The global ranks of `rank`'s group in dimension d, ordered by their coordinate in it.
std::vector<int> group_ranks(const ParallelDims& dims, int rank, Dim d);

}  // namespace tessera::parallel
