// Layer train: the trainer, the pipeline schedules, the step loop, step records, health checks and
// generation; it puts the layers below together. It must not know how its processes were launched
// (it is given a JobAddress).
//
// One training process: model, parameters and optimizer state, data, and the optimizer step
// (gradient accumulation, global grad-norm clipping, AdamW, learning-rate schedule), plus
// evaluation on the validation split.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/state.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "fsdp/sharded_params.h"
#include "metrics/memory.h"
#include "model/llama.h"
#include "optim/schedule.h"
#include "parallel/job.h"
#include "train/pipeline.h"
#include "train/synthetic.h"

namespace tessera::train {

// Where a step's wall time went on this rank (docs/metrics.md, "Step time split"): compute
// phases exclude the communication they waited for, which `comm` counts.
struct StepTimes {
  double data_wait = 0.0;  // the loader's next micro-batches
  double forward = 0.0;    // forward and loss (the LM head's fused backward is in `backward`)
  double backward = 0.0;
  double comm = 0.0;       // exposed: blocked on gathers, reductions and the step's all-reduce
  // Parts of comm by mesh dimension: blocked on the tensor-parallel collectives, and on the
  // pipeline's neighbours (its bubble included); the rest is the data-parallel side's.
  double comm_tp = 0.0, comm_pp = 0.0;
  double optimizer = 0.0;  // gradient norm, clipping and AdamW, less their communication
  double accounted() const { return data_wait + forward + backward + comm + optimizer; }
};

struct StepStats {
  int64_t step = 0;   // 1-based index of the step just taken
  double loss = 0.0;  // mean over the global batch's valid targets
  double lr = 0.0;
  double grad_norm = 0.0;  // before clipping
  double seconds = 0.0;
  StepTimes times;            // the split of `seconds` (the rest is bookkeeping)
  int64_t tokens = 0;         // tokens in this step (global)
  uint32_t signals = 0;       // the OR over ranks of the signals passed to step()
  bool skipped = false;       // non-finite loss or gradient norm, update skipped (train.on_nonfinite = skip)
  int64_t skipped_total = 0;  // steps skipped so far in this process
};

using checkpoint::TrainingState;
class PhaseClock;

class Trainer {
 public:
  // dataset_dir: a prepared dataset (its train and val splits), or empty for synthetic tokens.
  // Throws ConfigError when the model's vocabulary does not match the dataset's tokenizer. A
  // single process is the same code as rank 0 of 1. backend: where the model, its parameters and
  // optimizer state live (train/device.h resolves train.device to it); it outlives the trainer.
  Trainer(const config::Config& config, const std::string& dataset_dir, const parallel::Distributed& dist = {},
          kernels::Backend& backend = kernels::cpu_backend());

  // One optimizer step over the next global batch. On a non-finite loss or gradient norm (seen
  // by every rank in the same step: both are all-reduced) parameters and optimizer state are
  // left as they were, and with train.on_nonfinite = stop it throws NonFiniteError; with skip
  // the step counts as taken (its batch is dropped, StepStats::skipped is set) unless more than
  // train.max_skipped_steps steps in a row were non-finite, which throws; a skipped step moves the
  // schedule and the data on but not AdamW's step count, as PyTorch's GradScaler skips
  // optimizer.step(). The loss is the mean over the global batch's valid targets (summed over
  // micro-batches and ranks, then divided once), its gradient likewise. `signals`: bits this rank
  // raises (e.g. "stop requested"); every rank gets their OR over ranks in StepStats::signals,
  // carried by the step's loss all-reduce, so all ranks act on them after the same step.
  StepStats step(uint32_t signals = 0);
  // This rank's next micro-batch: inputs and targets (micro_batch, T); a negative target is ignored.
  using BatchSource = std::function<data::Loader::Batch()>;
  // step() over micro-batches from `next` (micro_batches_per_step() calls) instead of the loader,
  // which does not move: for batches the loader cannot express, such as masked targets.
  StepStats step(const BatchSource& next, uint32_t signals = 0);
  int64_t micro_batches_per_step() const { return loader_->micro_batches_per_step(); }
  static constexpr int kSignalBits = 4;  // signals < 2^kSignalBits
  // Floats in the step's all-reduce: the loss sum, the valid-target count, the signals, and per
  // rank busy time, RSS and peak.
  static constexpr int64_t step_reduce_floats(int world) { return 2 + kSignalBits + 3 * world; }
  // Mean loss per valid target over the first `batches` global batches of the validation split
  // (the same samples at any world size); 0: train.eval_batches; the whole split when `batches`
  // covers it (validation_batches()). Returns the mean and the targets it counted.
  struct Evaluation {
    double loss = 0.0;
    int64_t targets = 0;
  };
  Evaluation evaluate(int64_t batches = 0);
  // Global batches that cover the whole validation split (train.eval_batches for synthetic data,
  // an endless stream).
  int64_t validation_batches() const;

  const config::Config& config() const { return config_; }
  const parallel::Distributed& distributed() const { return dist_; }
  const model::ModelLayout& layout() const { return layout_; }
  // This stage's model (its first activation slot); the whole model without pipeline parallelism.
  model::Llama& model() { return pipeline_->model(); }
  fsdp::ShardedParams& params() { return *params_; }
  // AdamW's moments of this rank's shards (in the backend's memory).
  optim::AdamW& optimizer() { return optimizer_; }
  kernels::Backend& backend() const { return params_->backend(); }
  // Every parameter tensor of the whole model, on rank 0 (gathered from the shards, the tp blocks
  // and the pipeline stages); this stage's tensors elsewhere. A collective: every rank calls it.
  std::vector<model::NamedTensor> whole_model_tensors();
  // This rank's shards of the parameters and moments, as checkpoints save and load them (through
  // the backend).
  checkpoint::RankShards shards();
  int64_t steps_done() const { return step_; }
  TrainingState state() const { return {step_, tokens_, loader_->state().position, optimizer_steps_}; }
  // Each rank's busy seconds in the last step's forward and backward (wall time less the time
  // spent waiting on collectives), as every rank learns them with the step's loss.
  const std::vector<double>& rank_busy_seconds() const { return rank_busy_; }
  // This rank's memory at the end of the last step's backward (bytes).
  const metrics::ProcessMemory& memory() const { return memory_; }
  // Each rank's resident memory and its peak, as memory() (MiB resolution when gathered from
  // several ranks).
  const std::vector<int64_t>& rank_resident_bytes() const { return rank_rss_; }
  const std::vector<int64_t>& rank_peak_resident_bytes() const { return rank_peak_rss_; }
  // Continues from `state`: the step counts, tokens seen and the data position (the loader
  // restarts there). Parameters and moments are set through shards().
  void restore(const TrainingState& state);
  // The dataset's manifest; null for synthetic data.
  const data::DatasetManifest* dataset() const { return train_stream_ ? &train_stream_->manifest() : nullptr; }
  // Bytes of parameters, gradients and optimizer state, and of activations.
  size_t state_bytes() const;
  size_t activation_bytes() const { return pipeline_->activation_bytes(); }
  // Every arena this rank allocated at start-up, as allocated: shards and their companions, the
  // gathered-unit pool, the optimizer's moments, the activations (what `tessera plan` predicts).
  struct ArenaBytes {
    uint64_t shards = 0, buffers = 0, optimizer = 0, activations = 0;
    uint64_t total() const { return shards + buffers + optimizer + activations; }
  };
  ArenaBytes arena_bytes() const;

 private:
  using Reader = std::function<void(uint64_t, uint64_t, int32_t*)>;
  // Whether this rank adds its loss to the job's: one rank per data-parallel coordinate (the
  // first of its tensor-parallel group, on the last pipeline stage), so the sum is over dp.
  bool counts_loss() const;
  // The parts of step(): forward and backward over this step's micro-batches (returns the loss
  // sum); the step's all-reduce of the loss, signals and per-rank figures; the non-finite policy
  // (throws, or counts and logs a skipped update).
  model::LossSum accumulate_gradients(const BatchSource& next, int64_t positions, PhaseClock& clock, StepTimes& times);
  void share_step_figures(model::LossSum* loss_sum, uint32_t* signals);
  void skip_nonfinite(const std::string& what);

  config::Config config_;
  parallel::Distributed dist_;
  model::ModelLayout layout_;
  std::unique_ptr<fsdp::ShardedParams> params_;
  optim::AdamW optimizer_;
  // The stage's forwards and backwards over its micro-batches (one stage, one slot, without
  // pipeline parallelism: forward and backward of each micro-batch in turn).
  std::unique_ptr<PipelineStageRunner> pipeline_;
  std::unique_ptr<data::TokenStream> train_stream_, val_stream_;
  SyntheticTokens synthetic_train_, synthetic_val_;
  Reader val_reader_;
  uint64_t val_tokens_ = 0;
  Reader train_reader_;
  uint64_t train_tokens_ = 0;
  std::unique_ptr<data::Loader> loader_;
  optim::Schedule schedule_;
  std::vector<int32_t> eval_inputs_, eval_targets_;  // one micro-batch
  int64_t step_ = 0;
  int64_t optimizer_steps_ = 0;
  int64_t tokens_ = 0;
  int64_t skipped_in_a_row_ = 0, skipped_total_ = 0;
  std::vector<double> rank_busy_;  // world size
  metrics::ProcessMemory memory_;
  std::vector<int64_t> rank_rss_, rank_peak_rss_;  // world size
  // The step's all-reduce: loss sum, valid-target count, kSignalBits signals, then per rank busy
  // seconds, RSS and peak RSS (MiB).
  std::vector<float> reduce_buffer_;
};

// Sets the process's thread count from the config and returns it.
int configure_threads(const config::Config& config);

}  // namespace tessera::train
