// Pipeline parallelism (issue 15): the schedules, and one stage's step over its micro-batches.
//
// A stage holds consecutive blocks (model::PipelineStage): the first also the embedding, the last
// the final norm and the LM head. Micro-batch b's activations go forward from stage s to s + 1,
// and their gradients back, point to point over the pipeline group (comm::ProcessGroup send and
// recv, tags 2b and 2b + 1). Each micro-batch in flight on a stage has its own copy of the stage's
// activations (a model::Llama per slot).
//
// What an op hands on (its output, or its input's gradient) goes in one batch
// (ProcessGroup::send_recv) with what the next op needs, as Megatron-LM's 1F1B does
// (send_forward_recv_backward, send_backward_recv_forward): on NCCL, where a rank's transfers run
// in issue order on one stream, two neighbours that each send before they receive would otherwise
// wait for each other forever.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/process_group.h"
#include "config/config.h"
#include "data/loader.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/param_source.h"

namespace tessera::train {

using config::PipelineSchedule;

// One unit of a stage's work in a step.
struct PipelineOp {
  bool forward;
  int micro_batch;
};

// Stage `stage`'s work for a step of m micro-batches over P stages, in order. GPipe: every
// forward, then every backward. 1F1B (PipeDream-flush, Megatron-LM's default): min(P - s - 1, m)
// forwards, then one forward and one backward in turn, then the backwards left; a stage then
// holds the activations of at most P - s micro-batches, GPipe's of all m. Both have the same
// bubble, (P - 1) / (m + P - 1) of the step.
std::vector<PipelineOp> pipeline_schedule(PipelineSchedule schedule, int stages, int stage, int micro_batches);
// The most micro-batches whose activations stage `stage` holds at once.
int pipeline_in_flight(PipelineSchedule schedule, int stages, int stage, int micro_batches);

class PipelineStageRunner {
 public:
  // layout: this stage's (its PipelineStage names its place); group: the pipeline group (rank =
  // stage) for tensors in the backend's memory (NCCL on GPUs), null for one stage. The models are
  // built as Trainer builds its one (micro_batch, threads, recompute_every, bf16, backend).
  PipelineStageRunner(const model::ModelLayout& layout, int64_t micro_batch, int threads, int64_t recompute_every,
                      bool bf16, PipelineSchedule schedule, int micro_batches, comm::ProcessGroup* group,
                      comm::Millis timeout, kernels::Backend& backend = kernels::cpu_backend());

  // Micro-batch b's inputs and targets (B, T); read once per micro-batch, in order.
  using BatchSource = std::function<data::Loader::Batch(int micro_batch)>;
  // Around each forward and backward: before (ShardedParams::begin_micro_batch), after (timing;
  // a forward's LM-head backward, fused into it, took head_backward_seconds of it).
  struct Hooks {
    std::function<void(const PipelineOp&)> before;
    std::function<void(const PipelineOp&, double head_backward_seconds)> after;
  };

  // One step's forwards and backwards in schedule order, adding the gradient of grad_scale x the
  // loss sum to params' gradients. Returns this stage's loss sum over the micro-batches: the
  // loss on the last stage, zero elsewhere. A neighbour lost or late past the timeout is a
  // CollectiveError naming the stage, the micro-batch and the direction (exit 12).
  model::LossSum step(model::ParamSource& params, const BatchSource& batch, const Hooks& hooks, float grad_scale);
  // Forward only (evaluation), micro-batch after micro-batch.
  model::LossSum forward_only(model::ParamSource& params, const BatchSource& batch);

  int slots() const { return static_cast<int>(models_.size()); }
  model::Llama& model(int slot = 0) { return *models_[slot]; }
  size_t activation_bytes() const;
  // Seconds blocked on the neighbours so far (receiving, or waiting for a send to finish): the
  // pipeline's bubble and its communication. On a device, the compute stream's waits (timed by
  // events, counted once the stream has passed them).
  double blocked_seconds() const;

 private:
  // A transfer of one op: what it receives before it runs, or sends after; `what` names it in
  // errors ("micro-batch 3's activations from stage 0").
  struct Transfer {
    comm::PointToPoint p2p;
    std::string what;
  };
  // In flight: a batch of transfers, named.
  struct InFlight {
    std::unique_ptr<comm::Work> work;
    std::string what;
  };
  struct Slot {
    std::vector<int32_t> inputs;  // the micro-batch's inputs, for the embedding's backward
    int micro_batch = -1;
    InFlight send;  // the slot's output (forward) or input gradient, sent alone, in flight
  };
  // The ops in order; hooks null: forward only, without gradients (evaluation).
  model::LossSum run(const std::vector<PipelineOp>& ops, model::ParamSource& params, const BatchSource& batch,
                     const Hooks* hooks, float grad_scale);
  std::optional<Transfer> incoming(const PipelineOp& op);
  std::optional<Transfer> outgoing(const PipelineOp& op);
  // Issues what `done` hands on together with what `next` needs (either may be null); what `next`
  // needs is waited for before it runs, a lone send before its slot is used again.
  void post(const PipelineOp* done, const PipelineOp* next);
  // Waits for a batch on the host, naming it when it fails; the time counts as blocked.
  void finish(InFlight& f);
  // Orders what runs next after a batch. On a device stream the compute waits for it there while
  // the host goes on queueing work (the batch joins ordered_, waited for by the host at the end
  // of the pass, where a failure surfaces; NCCL's watchdog ends a wait past the timeout);
  // without one (Gloo) the host waits.
  void order(InFlight& f);
  // Runs `wait`, naming the batch in the CollectiveError it throws.
  void named(const InFlight& f, const std::function<void()>& wait) const;
  int slot_of(const PipelineOp& op) const { return op.micro_batch % slots(); }

  const model::ModelLayout& layout_;
  PipelineSchedule schedule_;
  int micro_batches_;
  comm::ProcessGroup* group_;
  comm::CollectiveOptions options_;
  int64_t activation_floats_ = 0;  // Llama::stage_floats(): N x C, or N / tp x C with sequence parallelism
  std::vector<std::unique_ptr<model::Llama>> models_;
  std::vector<Slot> slots_;
  InFlight incoming_;  // the next op's input, and perhaps the last op's output
  std::vector<InFlight> ordered_;  // waited for on the device, not yet on the host
  void* stream_ = nullptr;         // the backend's compute stream (a cudaStream_t); null on the CPU
  double blocked_seconds_ = 0.0;
};

}  // namespace tessera::train
