#include "plan/search.h"

#include <fmt/format.h>

#include <algorithm>

#include "core/error.h"

namespace tessera::plan {

Planned plan_config(config::Config c, const Cluster& cluster, int threads) {
  c.parallel.nproc = cluster.world();
  config::validate(c);
  Planned p;
  p.dims = parallel::dims_for(c, cluster.world());
  p.stages = memory_plans(c, p.dims, threads, cluster.hardware);
  p.step = step_plan(c, p.dims, cluster);
  p.config = std::move(c);
  return p;
}

std::vector<Candidate> search(const config::Config& base, const Cluster& cluster, int threads) {
  using config::Strategy;
  const int world = cluster.world(), G = cluster.devices_per_node;
  const uint64_t capacity = cluster.hardware.memory_bytes;
  std::vector<Candidate> out;
  for (Strategy strategy : {Strategy::kFullShard, Strategy::kShardGradOp, Strategy::kHybridShard, Strategy::kNoShard}) {
    for (int tp = 1; tp <= std::min(G, 8); tp *= 2) {
      for (int pp = 1; pp <= 16; pp *= 2) {
        if (world % (tp * pp) != 0) continue;
        const int dp = world / (tp * pp);
        // hybrid: shard inside a node, replicate across nodes (only where that differs).
        if (strategy == Strategy::kHybridShard && (G % tp != 0 || G / tp == 1 || dp <= G / tp || dp % (G / tp) != 0)) {
          continue;
        }
        for (int64_t mb = 1; mb <= 16; mb *= 2) {
          for (int64_t recompute : {int64_t{0}, int64_t{1}}) {
            config::Config c = base;
            c.parallel.strategy = strategy;
            c.parallel.tensor = tp;
            c.parallel.sequence_parallel = tp > 1;
            c.parallel.pipeline = pp;
            c.parallel.pipeline_layers.clear();
            c.parallel.shard_group_size = strategy == Strategy::kHybridShard ? G / tp : 0;
            c.train.micro_batch_size = mb;
            c.parallel.activation_checkpointing = recompute;
            Candidate cand;
            try {
              Planned p = plan_config(c, cluster, threads);
              cand.config = std::move(p.config);
              cand.dims = p.dims;
              cand.memory = peak_memory_plan(p.stages);
              cand.step = p.step;
            } catch (const ConfigError&) {
              continue;  // not a layout of this model and batch (divisibility): not a candidate
            }
            cand.fits = cand.memory.total() <= capacity;
            if (!cand.fits) {
              cand.why_not = fmt::format(
                  "needs {} per device (stage {}: parameters {}, gradients {}, optimizer {}, "
                  "buffers {}, activations {}, reserved {}), has {}",
                  format_bytes(cand.memory.total()), cand.memory.stage, format_bytes(cand.memory.params),
                  format_bytes(cand.memory.grads), format_bytes(cand.memory.optimizer),
                  format_bytes(cand.memory.buffers), format_bytes(cand.memory.activations),
                  format_bytes(cand.memory.reserved), format_bytes(capacity));
            }
            out.push_back(std::move(cand));
          }
        }
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& a, const Candidate& b) {
    if (a.fits != b.fits) return a.fits;
    return a.fits ? a.step.step_s < b.step.step_s : a.memory.total() < b.memory.total();
  });
  return out;
}

}  // namespace tessera::plan
