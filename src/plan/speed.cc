#include "plan/speed.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "core/check.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/model_config.h"
#include "plan/memory.h"

namespace tessera::plan {
namespace {

using parallel::ParallelDims;

// A group's links: inside one node, the devices' own; across nodes, the node's network shared by
// every device of the node (each is in a group of this kind, all communicating at once).
struct Link {
  double bandwidth, latency;
};

Link link_for(const Cluster& cl, int group_span) {
  const Hardware& h = cl.hardware;
  if (group_span <= cl.devices_per_node) return {h.intra_bandwidth, h.intra_latency};
  return {std::min(h.intra_bandwidth, h.inter_bandwidth / cl.devices_per_node), h.inter_latency};
}

// One stage's work per micro-batch and its units' share of it (what each prefetch hides behind).
struct StageWork {
  double compute_s = 0.0, memory_s = 0.0, overhead_s = 0.0, tp_s = 0.0, pp_s = 0.0;
  std::vector<double> unit_flops;  // forward + backward FLOPs of each unit, embedding first
  std::vector<double> unit_elements;  // each unit's padded length
  double micro_batch_s() const { return compute_s + memory_s + overhead_s + tp_s + pp_s; }
};

StageWork stage_work(const config::Config& c, const ParallelDims& dims, const Cluster& cl, int stage,
                     int64_t micro_batch) {
  const model::ModelConfig& m = c.model;
  const Hardware& h = cl.hardware;
  const bool bf16 = c.parallel.param_dtype == config::Precision::kBf16;
  const bool sp = c.sequence_parallel();
  const model::ModelLayout layout = stage_layout(c, dims, stage);
  const double n = static_cast<double>(micro_batch * m.seq_len), tp = dims.tp;
  const double C = static_cast<double>(m.dim), F = static_cast<double>(m.ffn_hidden),
               V = static_cast<double>(m.vocab_size),
               Q = static_cast<double>((m.n_heads + 2 * m.n_kv_heads) * m.head_dim());
  // A block's FLOPs: its GEMMs', and attention's 12 T C per token (MFU's count), each over its rate.
  const double attention = 12.0 * static_cast<double>(m.seq_len) * C * n / tp;
  const double block = model::block_flops_per_token(m) * n / tp, head = model::head_flops_per_token(m) * n / tp;
  const double gemm_rate = h.peak(bf16) * h.gemm_efficiency, attention_rate = h.peak(bf16) * h.attention_efficiency;
  const double block_s = (block - attention) / gemm_rate + attention / attention_rate;
  StageWork w;
  for (int u = 0; u < layout.num_units(); ++u) w.unit_elements.push_back(static_cast<double>(layout.unit(u).padded));
  if (layout.has_embedding()) w.unit_flops.push_back(0.0);  // a lookup
  for (int64_t i = 0; i < layout.num_layers(); ++i) {
    const int64_t k = c.parallel.activation_checkpointing;
    const bool recomputed = k > 0 && (layout.first_layer() + i) % k == 0;
    const double factor = recomputed ? 4.0 / 3.0 : 1.0;  // a recompute repeats the forward
    w.unit_flops.push_back(block * factor);
    w.compute_s += block_s * factor;
  }
  if (layout.has_head()) {
    w.unit_flops.push_back(head);
    w.compute_s += head / gemm_rate;
  }
  // Memory-bound passes, fp32, each activation element about three times (forward, backward and
  // the gradient's write) over what a block's elementwise kernels touch per token: two norms and
  // two residuals (C each, read and written), RoPE (q and k), SwiGLU (2F in, F out); the head's
  // softmax and loss gradient over V logits.
  const double residual = sp ? C / tp : C;
  const double block_bytes = 4.0 * 3.0 * (8.0 * residual + 2.0 * Q / tp + 3.0 * F / tp);
  const double head_bytes = layout.has_head() ? 4.0 * 3.0 * (V / tp + 2.0 * residual) : 0.0;
  w.memory_s = n * (static_cast<double>(layout.num_layers()) * block_bytes + head_bytes) / h.memory_bandwidth;
  // About thirty kernels per block (nine forward, eighteen backward, the recompute), four per
  // chunk of the loss's rows.
  const double chunk_rows =
      static_cast<double>(model::Llama::loss_chunk_rows(layout.local().vocab, micro_batch * m.seq_len));
  w.overhead_s = h.kernel_overhead *
                 (30.0 * static_cast<double>(layout.num_layers()) + (layout.has_head() ? 4.0 * n / chunk_rows : 0.0));
  if (dims.tp > 1) {
    // Two all-reduces of the (N, C) activations forward and two backward per block (sequence
    // parallel: all-gathers and reduce-scatters of the same bytes, plus the norm outputs gathered
    // again in backward: 1.25x); the embedding's all-reduce and the loss's three small ones.
    const Link l = link_for(cl, dims.tp);
    const double act = 4.0 * n * C;
    const double per_block = (sp ? 1.25 : 1.0) * 4.0 * ring_all_reduce_seconds(act, dims.tp, l.bandwidth, l.latency);
    w.tp_s = static_cast<double>(layout.num_layers()) * per_block;
    if (layout.has_embedding()) w.tp_s += 2.0 * ring_all_reduce_seconds(act, dims.tp, l.bandwidth, l.latency);
    if (layout.has_head()) w.tp_s += 3.0 * (n / chunk_rows) * 2.0 * (dims.tp - 1) * l.latency;
  }
  if (dims.pp > 1) {
    // Activations to the next stage, their gradient back: (R, C) each way, one hop to the rank
    // tp x dp places away (pp is the outermost dimension).
    const Link l = link_for(cl, 2 * dims.tp * dims.dp());
    const double bytes = 4.0 * n * residual;
    const int neighbours = (stage > 0 ? 1 : 0) + (stage + 1 < dims.pp ? 1 : 0);
    w.pp_s = neighbours * (bytes / l.bandwidth + l.latency);
  }
  return w;
}

// Exposed seconds of the dp collectives of one micro-batch: a unit's all-gather overlaps the
// compute of the unit before it (prefetch one ahead), forward in unit order and backward in
// reverse; on the last micro-batch a unit's reduce-scatter overlaps the next unit's backward and
// the last one's is exposed.
double exposed_gathers(const std::vector<double>& gather_s, const std::vector<double>& rs_s,
                       const std::vector<double>& fwd_s, const std::vector<double>& bwd_s, bool gather_in_backward) {
  const size_t U = gather_s.size();
  double exposed = gather_s[0];
  for (size_t u = 1; u < U; ++u) exposed += std::max(0.0, gather_s[u] - fwd_s[u - 1]);
  double in_flight = 0.0;  // the previous unit's reduce-scatter
  for (size_t i = 0; i < U; ++i) {
    const size_t u = U - 1 - i;
    const double next_gather = gather_in_backward && u > 0 ? gather_s[u - 1] : 0.0;
    exposed += std::max(0.0, next_gather + in_flight - bwd_s[u]);
    in_flight = rs_s[u];
  }
  return exposed + in_flight;
}

// Exposed seconds of no_shard's all-reduces on the last micro-batch: each unit's starts when its
// backward ends (or when the one before it is done: one group, one collective at a time) and runs
// beside the backward of the units after it; what is left when the backward ends is exposed.
// (hybrid_shard's start once their reduce-scatters are waited for, mostly after the backward:
// counted whole.)
double exposed_replica_reductions(const std::vector<double>& ar_s, const std::vector<double>& bwd_s) {
  double now = 0.0, done = 0.0;  // backward time, and when the group is free
  for (size_t i = 0; i < ar_s.size(); ++i) {
    const size_t u = ar_s.size() - 1 - i;
    now += bwd_s[u];
    done = std::max(done, now) + ar_s[u];
  }
  return std::max(0.0, done - now);
}

// The reduction of the embedding table's gradient when it goes row-sparse (fsdp/row_sparse.h: on
// Gloo, with no LM head on the stage tied to the table, over a group of `ranks`): an all-gather of
// each rank's row mask, then an all-reduce of the rows the group's tokens touched, as many as ids
// drawn uniformly would touch (text repeats its ids: fewer). -1 where the whole table is reduced.
double row_sparse_seconds(const config::Config& c, const ParallelDims& dims, const Hardware& h, int stage, int ranks,
                          double element_bytes, Link l) {
  if (!h.gloo || stage != 0 || ranks <= 1 || (c.model.tied_embeddings && dims.pp == 1)) return -1.0;
  const double V = static_cast<double>(c.model.vocab_size), rows = V / dims.tp;
  const double tokens = static_cast<double>(c.train.batch_size * c.model.seq_len) * ranks / dims.dp();
  const double touched = rows * (1.0 - std::exp(-tokens / V));
  if (2.0 * touched > rows) return -1.0;
  return ring_gather_seconds(rows / 8.0, ranks, l.bandwidth, l.latency) +
         ring_all_reduce_seconds(touched * static_cast<double>(c.model.dim) * element_bytes, ranks, l.bandwidth,
                                 l.latency);
}

// The data-parallel part of a stage's step beside and after its micro-batches: the dp collectives'
// seconds (all, and exposed), AdamW's pass over the stage's shard, the per-unit runtime.
struct StageTail {
  double exposed = 0.0, comm = 0.0, optimizer = 0.0, runtime = 0.0;
  double seconds() const { return exposed + optimizer + runtime; }
};

StageTail stage_tail(const config::Config& c, const ParallelDims& dims, const Cluster& cl, int p, const StageWork& w) {
  const Hardware& h = cl.hardware;
  const int64_t m = c.accumulation_steps();
  const bool bf16 = c.parallel.param_dtype == config::Precision::kBf16;
  const double pbytes = bf16 ? 2.0 : 4.0, rbytes = c.parallel.reduce_dtype == config::Precision::kBf16 ? 2.0 : 4.0;
  const int S = dims.dp_shard, R = dims.dp_replicate;
  const Link shard_link = link_for(cl, dims.tp * S), replica_link = link_for(cl, dims.tp * S * R);
  double total_flops = 0.0;
  for (double f : w.unit_flops) total_flops += f;
  std::vector<double> gather, rs, fwd, bwd;
  double shard_elements = 0.0;
  for (size_t u = 0; u < w.unit_elements.size(); ++u) {
    const double L = w.unit_elements[u], share = total_flops > 0 ? w.unit_flops[u] / total_flops : 0.0;
    shard_elements += L / S;
    gather.push_back(S > 1 ? ring_gather_seconds(L * pbytes, S, shard_link.bandwidth, shard_link.latency) : 0.0);
    rs.push_back(S > 1 ? ring_gather_seconds(L * rbytes, S, shard_link.bandwidth, shard_link.latency) : 0.0);
    const double busy = w.micro_batch_s() - w.tp_s - w.pp_s;
    fwd.push_back(busy * share / 3.0);
    bwd.push_back(busy * share * 2.0 / 3.0);
  }
  // FSDP: every micro-batch gathers (full_shard and hybrid twice, shard_grad_op once); the
  // gradients are reduced after the last one only.
  if (const double t = row_sparse_seconds(c, dims, h, p, S, rbytes, shard_link); t >= 0.0) rs[0] = t;
  const bool regather = c.parallel.strategy != config::Strategy::kShardGradOp;
  StageTail out;
  if (S > 1) {
    const std::vector<double> none(rs.size(), 0.0);
    out.exposed = static_cast<double>(m - 1) * exposed_gathers(gather, none, fwd, bwd, regather) +
                  exposed_gathers(gather, rs, fwd, bwd, regather);
    for (size_t u = 0; u < gather.size(); ++u)
      out.comm += static_cast<double>(m) * gather[u] * (regather ? 2 : 1) + rs[u];
  }
  if (R > 1) {  // replicas all-reduce the fp32 gradient shards, unit by unit
    std::vector<double> ar;
    for (double L : w.unit_elements)
      ar.push_back(ring_all_reduce_seconds(L / S * 4.0, R, replica_link.bandwidth, replica_link.latency));
    if (const double t = S == 1 ? row_sparse_seconds(c, dims, h, p, R, 4.0, replica_link) : -1.0; t >= 0.0) ar[0] = t;
    const double all = std::accumulate(ar.begin(), ar.end(), 0.0);
    out.comm += all;
    out.exposed += S > 1 ? all : exposed_replica_reductions(ar, bwd);
  }
  // AdamW reads master, gradient and both moments and writes three (28 bytes per element); the
  // norm reads the gradient and the next step zeroes it (8); AdamW's pass also writes the bf16
  // image of the master (2).
  const double per_element = 36.0 + (bf16 ? 2.0 : 0.0);
  out.optimizer = shard_elements * per_element / h.memory_bandwidth;
  out.runtime = h.unit_overhead * static_cast<double>(w.unit_elements.size());
  return out;
}

}  // namespace

double ring_gather_seconds(double bytes, int n, double bandwidth, double latency) {
  if (n <= 1) return 0.0;
  return (n - 1.0) / n * bytes / bandwidth + (n - 1.0) * latency;
}

double ring_all_reduce_seconds(double bytes, int n, double bandwidth, double latency) {
  return 2.0 * ring_gather_seconds(bytes, n, bandwidth, latency);
}

StepPlan step_plan(const config::Config& c, const ParallelDims& dims, const Cluster& cl) {
  const Hardware& h = cl.hardware;
  CHECK_MSG(c.parallel.nproc == dims.world(), "a step plan's config must have parallel.nproc = dims.world()");
  const int64_t micro_batch = c.micro_batch(), m = c.accumulation_steps();
  const bool bf16 = c.parallel.param_dtype == config::Precision::kBf16;
  StepPlan out;
  double slowest_mb = 0.0, worst_tail = 0.0;
  for (int p = 0; p < dims.pp; ++p) {
    const StageWork w = stage_work(c, dims, cl, p, micro_batch);
    const StageTail tail = stage_tail(c, dims, cl, p, w);
    if (w.micro_batch_s() > slowest_mb) {
      slowest_mb = w.micro_batch_s();
      out.slowest_stage = p;
      out.compute_s = static_cast<double>(m) * w.compute_s;
      out.memory_bound_s = static_cast<double>(m) * w.memory_s;
      out.overhead_s = static_cast<double>(m) * w.overhead_s;
      out.tp_comm_s = static_cast<double>(m) * w.tp_s;
      out.pp_comm_s = static_cast<double>(m) * w.pp_s;
    }
    if (tail.seconds() > worst_tail) {
      worst_tail = tail.seconds();
      out.dp_exposed_s = tail.exposed;
      out.dp_comm_s = tail.comm;
      out.optimizer_s = tail.optimizer;
      out.runtime_s = tail.runtime;
    }
  }
  // The slowest stage sets the pipeline's pace: m micro-batches plus P - 1 slots of bubble.
  const double P = dims.pp;
  out.bubble = (P - 1.0) / (static_cast<double>(m) + P - 1.0);
  out.bubble_s = (P - 1.0) * slowest_mb;
  // The gradient norm's and the loss's all-reduces over the world: latency only.
  const Link world_link = link_for(cl, dims.world());
  const double scalars = dims.world() > 1 ? 2.0 * 2.0 * (dims.world() - 1) * world_link.latency : 0.0;
  out.step_s = static_cast<double>(m) * slowest_mb + out.bubble_s + worst_tail + scalars;
  const double tokens = static_cast<double>(c.train.batch_size * c.model.seq_len);
  out.tokens_per_s = tokens / out.step_s;
  out.tokens_per_s_per_device = out.tokens_per_s / dims.world();
  out.mfu = out.tokens_per_s * model::flops_per_token(c.model) / (dims.world() * h.peak(bf16));
  return out;
}

}  // namespace tessera::plan
