// The parallel dimensions and their rank arithmetic.
#include "parallel/parallel_dims.h"

#include <fmt/format.h>

#include "config/config.h"
#include "core/check.h"
#include "core/error.h"

namespace tessera::parallel {
namespace {

// This rank's coordinate along each of the four layout axes, outermost first.
struct Coords {
  int pp, dpr, dps, tp;
};

Coords coords_of(const ParallelDims& d, int rank) {
  CHECK(rank >= 0 && rank < d.world());
  return {rank / (d.tp * d.dp_shard * d.dp_replicate), rank / (d.tp * d.dp_shard) % d.dp_replicate,
          rank / d.tp % d.dp_shard, rank % d.tp};
}

int rank_of(const ParallelDims& d, const Coords& c) {
  return ((c.pp * d.dp_replicate + c.dpr) * d.dp_shard + c.dps) * d.tp + c.tp;
}

}  // namespace

const char* name(Dim d) {
  switch (d) {
    case Dim::kWorld:
      return "world";
    case Dim::kDp:
      return "dp";
    case Dim::kDpShard:
      return "dp_shard";
    case Dim::kDpReplicate:
      return "dp_replicate";
    case Dim::kTp:
      return "tp";
    case Dim::kPp:
      return "pp";
  }
  return "?";
}

int ParallelDims::size(Dim d) const {
  switch (d) {
    case Dim::kWorld:
      return world();
    case Dim::kDp:
      return dp();
    case Dim::kDpShard:
      return dp_shard;
    case Dim::kDpReplicate:
      return dp_replicate;
    case Dim::kTp:
      return tp;
    case Dim::kPp:
      return pp;
  }
  return 1;
}

void ParallelDims::validate(int world_size) const {
  for (const auto& [key, v] :
       {std::pair{"pp", pp}, {"dp_replicate", dp_replicate}, {"dp_shard", dp_shard}, {"tp", tp}}) {
    if (v < 1) throw ConfigError(fmt::format("parallel dimensions {}: {} = {} must be >= 1", to_string(), key, v));
  }
  if (world() != world_size) {
    throw ConfigError(fmt::format("parallel dimensions {}: the product must be the world size, {} (parallel.nproc)",
                                  to_string(), world_size));
  }
}

std::string ParallelDims::to_string() const {
  return fmt::format("pp {} x dp_replicate {} x dp_shard {} x tp {} = {} ranks", pp, dp_replicate, dp_shard, tp,
                     world());
}

ParallelDims dims_for(const config::Config& config, int world) {
  ParallelDims d;
  const int64_t tensor = config.parallel.tensor, pipeline = config.parallel.pipeline;
  if (tensor < 1 || world % tensor != 0) {
    throw ConfigError(fmt::format("parallel.tensor = {} must divide the {} ranks (parallel.nproc)", tensor, world));
  }
  if (pipeline < 1 || world % (tensor * pipeline) != 0) {
    throw ConfigError(
        fmt::format("parallel.pipeline = {} x parallel.tensor = {} must divide the {} ranks "
                    "(parallel.nproc)",
                    pipeline, tensor, world));
  }
  d.tp = static_cast<int>(tensor);
  d.pp = static_cast<int>(pipeline);
  const int dp = world / (d.tp * d.pp);
  const int64_t group = config.parallel.shard_group_size;
  switch (config.parallel.strategy) {
    case config::Strategy::kFullShard:
    case config::Strategy::kShardGradOp:
      d.dp_shard = dp;
      break;
    case config::Strategy::kHybridShard:
      if (group < 0 || (group > 0 && dp % group != 0)) {
        throw ConfigError(
            fmt::format("parallel.shard_group_size = {} must divide the {} data-parallel ranks "
                        "(parallel.nproc / (parallel.pipeline x parallel.tensor); 0: all of them)",
                        group, dp));
      }
      d.dp_shard = group == 0 ? dp : static_cast<int>(group);
      d.dp_replicate = dp / d.dp_shard;
      break;
    case config::Strategy::kNoShard:
      d.dp_replicate = dp;
      break;
  }
  d.validate(world);
  return d;
}

int coordinate(const ParallelDims& dims, int rank, Dim d) {
  const Coords c = coords_of(dims, rank);
  switch (d) {
    case Dim::kWorld:
      return rank;
    case Dim::kDp:
      return c.dpr * dims.dp_shard + c.dps;
    case Dim::kDpShard:
      return c.dps;
    case Dim::kDpReplicate:
      return c.dpr;
    case Dim::kTp:
      return c.tp;
    case Dim::kPp:
      return c.pp;
  }
  return 0;
}

std::vector<int> group_ranks(const ParallelDims& dims, int rank, Dim d) {
  const Coords mine = coords_of(dims, rank);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(dims.size(d)));
  Coords c = mine;
  switch (d) {
    case Dim::kWorld:
      for (int r = 0; r < dims.world(); ++r) out.push_back(r);
      break;
    case Dim::kDp:
      for (c.dpr = 0; c.dpr < dims.dp_replicate; ++c.dpr) {
        for (c.dps = 0; c.dps < dims.dp_shard; ++c.dps) out.push_back(rank_of(dims, c));
      }
      break;
    case Dim::kDpShard:
      for (c.dps = 0; c.dps < dims.dp_shard; ++c.dps) out.push_back(rank_of(dims, c));
      break;
    case Dim::kDpReplicate:
      for (c.dpr = 0; c.dpr < dims.dp_replicate; ++c.dpr) out.push_back(rank_of(dims, c));
      break;
    case Dim::kTp:
      for (c.tp = 0; c.tp < dims.tp; ++c.tp) out.push_back(rank_of(dims, c));
      break;
    case Dim::kPp:
      for (c.pp = 0; c.pp < dims.pp; ++c.pp) out.push_back(rank_of(dims, c));
      break;
  }
  return out;
}

}  // namespace tessera::parallel
