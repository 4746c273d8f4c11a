// Layer fsdp: sharded data-parallel parameters over the mesh's data dimensions. It must not know
// checkpoints, data or the training loop.
//
// The fully sharded data-parallel ParamSource (ARCHITECTURE.md, "Sharding math"). Each unit's
// flat buffer is padded to a multiple of 16 x S and rank r of a shard group of S ranks owns
// [r L/S, (r+1) L/S) of it (parallel::shard_range): fp32 master parameters and gradients (the
// AdamW moments of the same range are optim::AdamW's). Full parameters
// are all-gathered into a small pool of unit buffers when the model acquires a unit, with the
// next unit's gather issued ahead (prefetch, in the order recorded during the first step), and
// gradients are reduce-scattered as each unit's backward completes.
//
// All four strategies are one mechanism over the mesh's two data-parallel groups, dp_shard (S
// ranks) and dp_replicate (R ranks), with D = S x R data-parallel ranks:
//   full_shard     S = D: gather for forward, free, gather again for backward
//   shard_grad_op  S = D: gather once, keep full parameters from forward until backward is done
//   hybrid_shard   S = shard_group_size: full_shard inside the group, then an all-reduce of the
//                  gradient shard across the R replicas (MiCS / HSDP)
//   no_shard       S = 1: every rank holds full parameters; gradients all-reduced (DDP)
//
// Under tensor parallelism each tp rank's units hold its blocks (model::ModelLayout's
// TensorParallel), sharded as above over the data-parallel ranks with its tp coordinate; the
// mesh's tp group carries the model's tp collectives (all-reduce, all-gather, reduce-scatter),
// and the gradient norm counts a replicated tensor (a norm gain, equal on every tp rank) once.
// Under pipeline parallelism the layout holds this stage's units only, and the norm sums over the
// stages too.
// With tied embeddings the last stage also holds a copy of the embedding unit for its LM head,
// sharded the same way: after the reductions its gradient shard goes to the first stage, which
// adds it to the table's before the norm, and after each update the table's values come back.
// Megatron-LM all-reduces the two gradients and steps both copies; this sends the same bytes
// and keeps optimizer state and checkpoints to the one table.
//
// On a device backend (train.device = cuda) the shards, gradients, bf16 image, the pool of unit
// buffers and the update live in the backend's memory, and the data-parallel collectives run on
// the mesh's device groups (NCCL), each ordered after the compute stream's work so far
// (CollectiveOptions::after) and waited for on the host before compute reads its output; the
// gradient norm's sum and the whole-model gathers (gather_named_*) go over the host groups.
// Tensor and pipeline parallelism are CPU-only. Everything that hands tensors to the host copies
// through the backend; master_shard and grads point into its memory.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"
#include "core/arena.h"
#include "kernels/backend.h"
#include "model/layout.h"
#include "model/named_tensor.h"
#include "model/param_source.h"
#include "optim/adamw.h"
#include "parallel/mesh.h"
#include "parallel/shard_range.h"

namespace tessera::fsdp {

using config::Strategy;

// Persistent per-rank bytes: master params and gradients (fp32 shards).
struct StateBytes {
  uint64_t params = 0, grads = 0;
};

// What a ShardedParams allocates at construction, in bytes: its state arena (master and gradient
// shards, their alignment and bf16 companions) and its pool of full-unit buffers (the units in
// use and prefetched, gradients awaiting reduction). Planned before the object exists, by the
// constructor and by `tessera plan` alike.
struct ArenaBytes {
  uint64_t state = 0, buffers = 0;
  uint64_t shard_elements = 0;  // this rank's elements over all units (masters, gradients: 4 bytes each)
  int param_buffers = 0, grad_buffers = 0;
};

class ShardedParams final : public model::ParamSource {
 public:
  // The arenas of a ShardedParams over `layout` with a shard group of `shards` ranks.
  static ArenaBytes planned_bytes(const model::ModelLayout& layout, Strategy strategy, int shards, int64_t accumulation,
                                  comm::DType param_dtype, comm::DType reduce_dtype);

  // The mesh's dp_shard group (S ranks) shards each unit; its dp_replicate group holds the same
  // shard on each of its ranks (hybrid_shard's replicas, no_shard's DDP). layout must be padded
  // to 16 x S. accumulation: micro-batches per step; gradients are communicated after the last
  // one only. param_dtype: what parameters are all-gathered in; reduce_dtype: what gradients are
  // reduced in (bf16 halves the bytes; masters, gradient shards and moments stay fp32). With
  // param_dtype bf16 acquire_bf16 hands out the bf16 image for bf16 compute: the gathered bf16
  // buffer itself, or with S = 1 the master rounded to bf16. backend: where shards and updates
  // live (a device backend needs a mesh of one rank). The mesh and the backend outlive this object.
  ShardedParams(const model::ModelLayout& layout, uint64_t seed, Strategy strategy, const parallel::Mesh& mesh,
                int64_t accumulation, comm::Millis timeout, comm::DType param_dtype = comm::DType::kF32,
                comm::DType reduce_dtype = comm::DType::kF32, kernels::Backend& backend = kernels::cpu_backend());
  ~ShardedParams() override;

  const float* acquire(int unit) override;
  // With param_dtype bf16: the unit's parameters as gathered, not widened; nullptr otherwise.
  const uint16_t* acquire_bf16(int unit) override;
  void release(int unit) override;
  float* grads(int unit) override;
  void grads_ready(int unit) override;
  // Blocking collectives over the mesh's tp group, counted as exposed communication.
  void tp_all_reduce(float* data, int64_t count) override;
  void tp_all_gather(const float* in, float* out, int64_t count) override;
  void tp_all_gather_bf16(const uint16_t* in, uint16_t* out, int64_t count) override;
  void tp_reduce_scatter(const float* in, float* out, int64_t count) override;

  // Before the first micro-batch of a step: zeroes gradient shards.
  void begin_step();
  // Before each micro-batch; gradients are reduced during the last one (index accumulation - 1).
  void begin_micro_batch(int64_t index) { micro_ = index; }
  // Fault injection (core/fault.h, kind nan): the next unit whose gradients are ready gets a NaN
  // on this rank before any reduction reads them, as if its backward had produced one; the
  // reductions and the norm spread it to every rank.
  void poison_next_gradients() { poison_ = true; }
  // After the last micro-batch: waits for every reduction; returns the global gradient norm.
  double finish_step();
  // Has `adamw` update each master shard from its gradient shard scaled by grad_scale (the clip
  // factor, times any rescaling of the loss), in one pass that with bf16 parameters also writes
  // the next step's bf16 image. step: AdamW's 1-based update count (bias correction). adamw holds
  // moments for shard_sizes().
  void apply_update(optim::AdamW& adamw, double lr, int64_t step, double grad_scale);
  std::vector<int64_t> shard_sizes() const;  // shard_range(u).size of every unit of the layout
  // Tied embeddings under pipeline parallelism (model::ModelLayout::tied_copy): the first stage
  // sends its table's shard to the last stage's copy (a collective of the two; nothing
  // elsewhere). apply_update ends with it; call it after writing master shards otherwise
  // (loading a checkpoint).
  void sync_tied_copy();

  // Every parameter tensor by name, whole: gathered from all shards and every tp rank's block (a
  // collective: all ranks call it).
  std::vector<model::NamedTensor> gather_named_tensors();
  // The same for the gradient shards as the last step left them: reduced, not scaled (apply_update
  // scales them as AdamW reads them; a collective).
  std::vector<model::NamedTensor> gather_named_gradients();
  // Sets this rank's shards from whole tensors by name (its tp block's part of each). Throws
  // DataError naming `origin` and the tensor when one is missing or has another shape. A collective
  // when a tied copy is synced (sync_tied_copy): all ranks call it.
  void load_tensors(const std::vector<model::NamedTensor>& tensors, const std::string& origin);
  // This rank's shard of `unit`: its elements of the unit's padded buffer (parallel::shard_range).
  parallel::ShardRange shard_range(int unit) const;
  // In the backend's memory (marks the unit's bf16 image stale: the caller may write it).
  float* master_shard(int unit);
  kernels::Backend& backend() const { return backend_; }
  StateBytes state_bytes() const;
  ArenaBytes arena_bytes() const { return {state_.capacity(), pool_.capacity(), 0, 0, 0}; }  // as allocated
  // Waits on communication so far: the host's, and on a GPU the compute stream's for gathers.
  double exposed_comm_seconds() const;
  double tp_comm_seconds() const { return tp_seconds_; }  // the part spent in the tp collectives
  // Rows of the embedding table's gradient the last step reduced: those some rank's batch touched
  // (row_sparse.h), or all of them when that was more than half of them; 0 where the table's
  // gradient is reduced whole (on a device, tied to the LM head, no data-parallel ranks).
  int64_t table_rows_reduced() const { return table_rows_reduced_; }

 private:
  struct Unit;
  std::vector<model::NamedTensor> gather_named(float* Unit::*shard);
  void issue_gather(int unit);
  void acquire_unit(int unit);  // gathers (or waits for) the unit, counts the reference, prefetches
  void free_params(int unit);
  void maybe_free_params(int unit);
  void complete_oldest_reduction();  // also issues the unit's replica reduction
  // The unit's gradient shard, complete on this rank, all-reduced over dp_replicate (no-op
  // without replicas): no_shard issues it as the unit's backward ends (DDP's bucket: one unit),
  // hybrid_shard once its reduce-scatter is done; finish_step waits for them all.
  void issue_replica_reduction(int unit);
  void issue_shard_reduction(int unit);  // the unit's reduce-scatter over dp_shard (S > 1)
  // The embedding's gradient reduced as the rows some rank touched, packed (row_sparse.h); false
  // (nothing issued) when the dense reduction is the cheaper.
  bool issue_row_sparse_reduction(int unit);
  void finish_row_sparse(Unit& u);  // after its reduction: unpacks (S > 1: widens bf16 first)
  void wait(comm::Work& work);  // waits and counts the time as exposed communication
  void wait_tp(comm::Work& work);  // the same, counted as the tp collectives' too
  void finish_gather(Unit& u);  // waits for the unit's gather (and widens bf16)
  void refresh_image(Unit& u);  // rounds the master into its bf16 image unless that is current
  double local_sum_squares() const;  // of the gradient shards, each element of the model once
  int tied_peer() const;             // the stage holding the other side of a tied table, or -1
  void join_tied_gradients();        // the copy's gradient shard added to the table's

  model::ModelLayout layout_;
  kernels::Backend& backend_;
  Strategy strategy_;
  int shard_rank_, shards_;            // this rank's coordinate in dp_shard, S
  comm::ProcessGroup* shard_group_;    // dp_shard (null when S = 1), for the backend's memory
  comm::ProcessGroup* replica_group_;  // dp_replicate (null without replicas), the same
  comm::ProcessGroup* host_shard_group_;  // dp_shard for host memory (the norm, gather_named)
  comm::ProcessGroup* tp_group_;          // tp (null without tensor parallelism), for the backend's memory
  comm::ProcessGroup* host_tp_group_;     // tp for host memory (the norm, gather_named)
  comm::ProcessGroup* pp_group_;          // pp (null without pipeline parallelism), for the backend's memory
  comm::ProcessGroup* host_pp_group_;     // pp for host memory (the norm)
  int64_t accumulation_;
  comm::CollectiveOptions options_;
  comm::DType param_dtype_, reduce_dtype_;
  std::vector<std::unique_ptr<Unit>> units_;
  kernels::Memory state_memory_;  // the backend's memory under state_
  Arena state_;                   // shards: master, grads and their bf16 companions
  kernels::Memory pool_memory_;   // the backend's memory under pool_
  float* tied_recv_ = nullptr;    // tied embeddings' first stage: the copy's gradient shard, received
  Arena pool_;   // full parameter and gradient buffers
  std::vector<float*> free_param_buffers_, free_grad_buffers_;
  std::map<const float*, uint16_t*> companion_;  // bf16 image of each pooled buffer
  std::vector<int> pending_;  // units whose gradient reduce-scatter is in flight, oldest first
  std::vector<int> replica_pending_;  // units whose replica all-reduce is in flight
  std::vector<int> order_;    // acquire order recorded during the first step
  bool recording_ = true;
  size_t cursor_ = 0;
  int64_t micro_ = 0;         // index of the micro-batch in progress
  bool poison_ = false;       // poison_next_gradients() was called
  double exposed_seconds_ = 0.0;
  double tp_seconds_ = 0.0;
  int64_t table_rows_ = 0, table_width_ = 0;  // the embedding table reduced row-sparse; 0 rows: never
  int64_t table_rows_reduced_ = 0;
};

}  // namespace tessera::fsdp
