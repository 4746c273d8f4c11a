// `tessera plan --search`: the layouts of a model on a cluster that fit, fastest first, and why
// the others do not.
#pragma once

#include <string>
#include <vector>

#include "config/config.h"
#include "parallel/parallel_dims.h"
#include "plan/memory.h"
#include "plan/speed.h"

namespace tessera::plan {

struct Candidate {
  config::Config config;  // the base config with this layout's keys set
  parallel::ParallelDims dims;
  MemoryPlan memory;  // the stage that needs the most
  StepPlan step;
  bool fits = false;
  std::string why_not;  // when it does not fit: the numbers
};

// The config laid out over the cluster: parallel.nproc set to its world, validated (ConfigError
// naming the key otherwise), with its dims.
struct Planned {
  config::Config config;
  parallel::ParallelDims dims;
  std::vector<MemoryPlan> stages;
  StepPlan step;
};
Planned plan_config(config::Config config, const Cluster& cluster, int threads);

// Every valid combination of strategy, tensor and pipeline degree, micro-batch and recompute for
// the base config's model and global batch: those that fit first (fastest first), then the rest
// (least memory first).
std::vector<Candidate> search(const config::Config& base, const Cluster& cluster, int threads);

}  // namespace tessera::plan
