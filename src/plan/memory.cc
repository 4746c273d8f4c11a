#include "plan/memory.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

#include "comm/process_group.h"
#include "core/check.h"
#include "fsdp/sharded_params.h"
#include "model/layout.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "train/pipeline.h"

namespace tessera::plan {
namespace {

comm::DType dtype_of(config::Precision p) {
  return p == config::Precision::kBf16 ? comm::DType::kBF16 : comm::DType::kF32;
}

// The host groups' own buffers (comm::make_host_group), on the rank `first` of a stage: a group
// whose ranks share a node (unless parallel.host_transport = tcp) maps a shared-memory segment,
// whose pages its ranks touch; a group over TCP keeps Gloo's exchange buffer at its largest, which
// for dp_shard's reduce-scatters holds every rank's chunks of its input, the largest unit (the
// replicas' all-reduces run in fp32, in place).
uint64_t host_comm_workspace(const config::Config& c, const parallel::ParallelDims& dims,
                             const model::ModelLayout& layout, int first, int ranks_per_node) {
  const uint64_t reduce_bytes = c.parallel.reduce_dtype == config::Precision::kBf16 ? 2 : 4;
  uint64_t largest = 0;
  for (int u = 0; u < layout.num_units(); ++u) largest = std::max<uint64_t>(largest, layout.unit(u).padded);
  const std::vector<int> shard_group =
      dims.dp_shard > 1 ? parallel::group_ranks(dims, first, parallel::Dim::kDpShard) : std::vector<int>{};
  std::set<std::vector<int>> seen;
  uint64_t bytes = 0;
  for (const parallel::Dim d : parallel::kAllDims) {
    if (dims.size(d) == 1) continue;
    const std::vector<int> ranks = parallel::group_ranks(dims, first, d);
    if (!seen.insert(ranks).second) continue;
    const auto [lo, hi] = std::minmax_element(ranks.begin(), ranks.end());
    const bool one_node = ranks_per_node > 0 && *lo / ranks_per_node == *hi / ranks_per_node;
    if (one_node && c.parallel.host_transport != config::HostTransport::kTcp) {
      bytes += comm::shm_segment_bytes(static_cast<int>(ranks.size()));
    } else if (ranks == shard_group) {
      bytes += largest * reduce_bytes;
    }
  }
  return bytes;
}

}  // namespace

std::vector<MemoryPlan> memory_plans(const config::Config& c, const parallel::ParallelDims& dims, int threads,
                                     const Hardware& hardware) {
  CHECK_MSG(c.parallel.nproc == dims.world(), "a memory plan's config must have parallel.nproc = dims.world()");
  const int64_t micro_batch = c.micro_batch(), accumulation = c.accumulation_steps();
  const bool bf16 = c.parallel.param_dtype == config::Precision::kBf16;
  std::vector<MemoryPlan> plans;
  for (int p = 0; p < dims.pp; ++p) {
    const model::ModelLayout layout = stage_layout(c, dims, p);
    const fsdp::ArenaBytes shards =
        fsdp::ShardedParams::planned_bytes(layout, c.parallel.strategy, dims.dp_shard, accumulation,
                                           dtype_of(c.parallel.param_dtype), dtype_of(c.parallel.reduce_dtype));
    std::vector<int64_t> slices;  // the optimizer's: the layout's units (not the tied copy)
    for (int u = 0; u < layout.num_units(); ++u) slices.push_back(layout.unit(u).padded / dims.dp_shard);
    MemoryPlan m;
    m.stage = p;
    m.grads = sizeof(float) * shards.shard_elements;
    m.params = shards.state - m.grads;
    m.buffers = shards.buffers;
    m.optimizer = optim::AdamW::planned_bytes(slices);
    m.activation_slots =
        train::pipeline_in_flight(c.parallel.pipeline_schedule, dims.pp, p, static_cast<int>(accumulation));
    m.activations = m.activation_slots * model::Llama::planned_activation_bytes(
                                             layout, micro_batch, threads, c.parallel.activation_checkpointing, bf16);
    m.reserved = hardware.reserved_bytes;
    if (hardware.gloo) {
      m.comm_workspace = host_comm_workspace(c, dims, layout, p * (dims.world() / dims.pp), hardware.devices_per_node);
    }
    plans.push_back(m);
  }
  return plans;
}

model::ModelLayout stage_layout(const config::Config& c, const parallel::ParallelDims& dims, int stage) {
  return model::ModelLayout(c.model, 16 * dims.dp_shard, {dims.tp, 0, c.sequence_parallel()},
                            model::pipeline_stage(c.model, dims.pp, stage, c.parallel.pipeline_layers));
}

MemoryPlan peak_memory_plan(const std::vector<MemoryPlan>& plans) {
  return *std::max_element(plans.begin(), plans.end(),
                           [](const MemoryPlan& a, const MemoryPlan& b) { return a.total() < b.total(); });
}

std::string format_bytes(double bytes) {
  if (bytes >= 1024.0 * 1024.0 * 1024.0) return fmt::format("{:.2f} GiB", bytes / (1024.0 * 1024.0 * 1024.0));
  return fmt::format("{:.1f} MiB", bytes / (1024.0 * 1024.0));
}

}  // namespace tessera::plan
