// One training process: the optimizer step and evaluation.
#include "train/trainer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/check.h"
#include "core/error.h"
#include "core/fault.h"
#include "core/log.h"
#include "core/threads.h"
#include "core/timer.h"
#include "optim/adamw.h"
#include "train/init_from.h"

namespace tessera::train {
namespace {

std::unique_ptr<data::TokenStream> open_split(const std::string& dir, const char* split, const std::string& cache) {
  if (dir.empty()) return nullptr;
  return std::make_unique<data::TokenStream>(dir, split, cache);
}

// Each data-parallel rank reads its slice of the global batch (tensor-parallel ranks of one dp
// coordinate read the same one).
data::LoaderOptions loader_options(const config::Config& c, const parallel::Mesh& mesh) {
  return {c.model.seq_len, c.micro_batch(), c.train.batch_size, mesh.rank(parallel::Dim::kDp),
          mesh.size(parallel::Dim::kDp)};
}

comm::DType dtype_of(config::Precision p) {
  return p == config::Precision::kBf16 ? comm::DType::kBF16 : comm::DType::kF32;
}

optim::AdamWConfig adamw_config(const config::Config& c) {
  optim::AdamWConfig adam;
  adam.lr = c.train.lr;
  adam.beta1 = c.train.beta1;
  adam.beta2 = c.train.beta2;
  adam.eps = c.train.eps;
  adam.weight_decay = c.train.weight_decay;
  return adam;
}

optim::Schedule schedule_of(const config::TrainConfig& t) {
  optim::Schedule s{t.lr, t.min_lr, t.warmup_steps, t.max_steps};
  switch (t.lr_decay) {
    case config::LrDecay::kCosine:
      s.decay = optim::LrDecay::kCosine;
      break;
    case config::LrDecay::kLinear:
      s.decay = optim::LrDecay::kLinear;
      break;
    case config::LrDecay::kSqrt:
      s.decay = optim::LrDecay::kSqrt;
      break;
    case config::LrDecay::kNone:
      s.decay = optim::LrDecay::kNone;
      break;
  }
  s.decay_steps = t.lr_decay_steps;
  return s;
}

}  // namespace

int configure_threads(const config::Config& config) {
  set_num_threads(static_cast<int>(config.train.threads));
  return num_threads();
}

Trainer::Trainer(const config::Config& config, const std::string& dataset_dir, const parallel::Distributed& dist,
                 kernels::Backend& backend)
    : config_(config),
      dist_(dist),
      layout_(config.model, 16 * dist.mesh->size(parallel::Dim::kDpShard),
              {dist.mesh->size(parallel::Dim::kTp), dist.mesh->rank(parallel::Dim::kTp), config.sequence_parallel()},
              model::pipeline_stage(config.model, dist.mesh->size(parallel::Dim::kPp),
                                    dist.mesh->rank(parallel::Dim::kPp), config.parallel.pipeline_layers)),
      params_(std::make_unique<fsdp::ShardedParams>(
          layout_, static_cast<uint64_t>(config.train.seed), config.parallel.strategy, *dist.mesh,
          config.accumulation_steps(), comm::Millis(config.parallel.timeout_ms), dtype_of(config.parallel.param_dtype),
          dtype_of(config.parallel.reduce_dtype), backend)),
      optimizer_(adamw_config(config), params_->shard_sizes(), backend),
      pipeline_(std::make_unique<PipelineStageRunner>(
          layout_, config.micro_batch(), configure_threads(config), config.parallel.activation_checkpointing,
          config.parallel.param_dtype == config::Precision::kBf16, config.parallel.pipeline_schedule,
          static_cast<int>(config.accumulation_steps()), dist.mesh->device_group(parallel::Dim::kPp),
          comm::Millis(config.parallel.timeout_ms), backend)),
      train_stream_(open_split(dataset_dir, "train", config.data.cache_dir)),
      val_stream_(open_split(dataset_dir, "val", config.data.cache_dir)),
      synthetic_train_(static_cast<uint64_t>(config.train.seed), config.model.vocab_size),
      synthetic_val_(static_cast<uint64_t>(config.train.seed) + 1, config.model.vocab_size),
      train_reader_(train_stream_
                        ? Reader([s = train_stream_.get()](uint64_t b, uint64_t n, int32_t* o) { s->read(b, n, o); })
                        : Reader([s = &synthetic_train_](uint64_t b, uint64_t n, int32_t* o) { s->read(b, n, o); })),
      train_tokens_(train_stream_ ? train_stream_->size() : SyntheticTokens::kLength),
      loader_(std::make_unique<data::Loader>(train_reader_, train_tokens_, static_cast<uint64_t>(config.train.seed),
                                             loader_options(config, *dist.mesh), data::SamplerState{})),
      eval_inputs_(config.micro_batch() * config.model.seq_len),
      eval_targets_(config.micro_batch() * config.model.seq_len),
      rank_busy_(dist.world_size(), 0.0),
      rank_rss_(dist.world_size(), 0),
      rank_peak_rss_(dist.world_size(), 0),
      reduce_buffer_(step_reduce_floats(dist.world_size())) {
  // The config's derived sizes (micro-batches per step) assume this world size.
  CHECK_MSG(config.parallel.nproc == dist.world_size(), "parallel.nproc must equal the world size");
  if (const int64_t P = config.parallel.pipeline; P > 1 && config.accumulation_steps() < P) {
    log::warn(
        "{} micro-batches per step through {} pipeline stages: the bubble takes {:.0f}% of each step; "
        "lower train.micro_batch_size to have more micro-batches",
        config.accumulation_steps(), P,
        100.0 * static_cast<double>(P - 1) / static_cast<double>(config.accumulation_steps() + P - 1));
  }
  if (train_stream_) {
    const data::DatasetManifest& m = train_stream_->manifest();
    if (m.vocab_size != config.model.vocab_size) {
      throw ConfigError(
          fmt::format("config key model.vocab_size = {} does not match the dataset {} (tokenizer {} has "
                      "{} tokens); set model.vocab_size = {}",
                      config.model.vocab_size, dataset_dir, m.tokenizer_file, m.vocab_size, m.vocab_size));
    }
    val_reader_ = [s = val_stream_.get()](uint64_t b, uint64_t n, int32_t* o) { s->read(b, n, o); };
    val_tokens_ = val_stream_->size();
  } else {
    val_reader_ = [s = &synthetic_val_](uint64_t b, uint64_t n, int32_t* o) { s->read(b, n, o); };
    val_tokens_ = SyntheticTokens::kLength;
  }
  schedule_ = schedule_of(config.train);
  // Every rank reads the whole file and keeps its shard.
  if (!config.train.init_from.empty()) params_->load_tensors(load_init_weights(config), config.train.init_from);
}

Trainer::ArenaBytes Trainer::arena_bytes() const {
  const fsdp::ArenaBytes shards = params_->arena_bytes();
  return {shards.state, shards.buffers, optimizer_.arena_bytes(), activation_bytes()};
}

size_t Trainer::state_bytes() const {
  const fsdp::StateBytes b = params_->state_bytes();
  return b.params + b.grads + optimizer_.bytes();
}

std::vector<model::NamedTensor> Trainer::whole_model_tensors() {
  std::vector<model::NamedTensor> mine = params_->gather_named_tensors();  // whole over dp and tp
  const parallel::Mesh& mesh = *dist_.mesh;
  const int P = mesh.size(parallel::Dim::kPp), stage = mesh.rank(parallel::Dim::kPp);
  // Each stage's first rank (dp and tp coordinate 0) sends its tensors to rank 0, stage 0's,
  // over their pipeline group, in the order the stage's layout lists them.
  if (P == 1 || mesh.rank(parallel::Dim::kDp) != 0 || mesh.rank(parallel::Dim::kTp) != 0) return mine;
  comm::ProcessGroup& group = *mesh.group(parallel::Dim::kPp);
  const comm::CollectiveOptions options{comm::Millis(config_.parallel.timeout_ms)};
  if (stage > 0) {
    for (size_t i = 0; i < mine.size(); ++i) {
      const auto n = static_cast<int64_t>(mine[i].data.size());
      group.send(mine[i].data.data(), n, comm::DType::kF32, 0, static_cast<uint32_t>(i), options)->wait();
    }
    return mine;
  }
  for (int p = 1; p < P; ++p) {
    const model::ModelLayout whole(config_.model, 16, {},
                                   model::pipeline_stage(config_.model, P, p, config_.parallel.pipeline_layers));
    uint32_t i = 0;
    for (const model::UnitLayout& u : whole.units()) {
      for (const model::TensorSpec& t : u.tensors) {
        model::NamedTensor named{t.name, t.full_shape, std::vector<float>(static_cast<size_t>(t.full_numel()))};
        group.recv(named.data.data(), t.full_numel(), comm::DType::kF32, p, i++, options)->wait();
        mine.push_back(std::move(named));
      }
    }
  }
  return mine;
}

checkpoint::RankShards Trainer::shards() {
  checkpoint::RankShards out{&layout_, {}, &params_->backend()};
  for (int u = 0; u < layout_.num_units(); ++u) {
    out.units.push_back(
        {params_->shard_range(u), params_->master_shard(u), optimizer_.exp_avg(u), optimizer_.exp_avg_sq(u)});
  }
  return out;
}

void Trainer::restore(const TrainingState& state) {
  loader_.reset();  // joins the prefetch thread before its successor starts
  loader_ =
      std::make_unique<data::Loader>(train_reader_, train_tokens_, static_cast<uint64_t>(config_.train.seed),
                                     loader_options(config_, *dist_.mesh), data::SamplerState{state.sampler_position});
  step_ = state.step;
  optimizer_steps_ = state.optimizer_steps;
  tokens_ = state.tokens;
  params_->sync_tied_copy();  // the checkpoint holds the table only
}

StepStats Trainer::step(uint32_t signals) {
  return step([this] { return loader_->next(); }, signals);
}

// Splits a step's wall time into phases: a phase's compute time excludes the communication the
// parameters waited for meanwhile, which counts as comm.
class PhaseClock {
 public:
  PhaseClock(const fsdp::ShardedParams& params, const PipelineStageRunner& pipeline, StepTimes& times)
      : params_(params), pipeline_(pipeline), times_(times), t_(now_seconds()), comm_(waited_total()) {}
  // Compute seconds since the last mark (the construction or any call).
  double compute() {
    const double now = now_seconds(), waited = waited_total() - comm_;
    const double compute = now - t_ - waited;
    times_.comm += waited;
    t_ = now;
    comm_ += waited;
    return compute;
  }
  // Everything since the last mark was communication.
  void communication() {
    const double now = now_seconds();
    times_.comm += now - t_;
    t_ = now;
  }
  void restart() { t_ = now_seconds(); }  // what ran since the last mark is bookkeeping

 private:
  // Blocked on gathers and reductions, and on the pipeline's neighbours (its bubble included).
  double waited_total() const { return params_.exposed_comm_seconds() + pipeline_.blocked_seconds(); }
  const fsdp::ShardedParams& params_;
  const PipelineStageRunner& pipeline_;
  StepTimes& times_;
  double t_, comm_;
};

StepStats Trainer::step(const BatchSource& next, uint32_t signals) {
  CHECK(signals < (1u << kSignalBits));
  const double t0 = now_seconds();
  StepTimes times;
  const double tp0 = params_->tp_comm_seconds(), pp0 = pipeline_->blocked_seconds();
  PhaseClock clock(*params_, *pipeline_, times);
  params_->begin_step();
  // The step's loss is the sum over the global batch's valid targets divided by their count,
  // which no rank knows before its backward. Each target's gradient is scaled by 1 / positions
  // (every target of the global batch: the count when nothing is ignored) and the sum, reduced
  // over ranks, is rescaled by positions / count once the count is known (with the loss, below):
  // no extra collective, and no rescaling pass unless targets were ignored.
  const int64_t positions = config_.tokens_per_step();
  model::LossSum loss_sum = accumulate_gradients(next, positions, clock, times);
  // This rank's busy time (forward and backward, not the time spent waiting on collectives or
  // data): a slow rank shows here, its peers only wait for it.
  rank_busy_[dist_.rank()] = times.forward + times.backward;
  memory_ = metrics::process_memory();
  rank_rss_[dist_.rank()] = memory_.resident;
  rank_peak_rss_[dist_.rank()] = memory_.peak;
  if (dist_.world() != nullptr) {
    clock.restart();
    share_step_figures(&loss_sum, &signals);
    clock.communication();
  }
  const double loss = loss_sum.mean();
  // positions / count: 1 unless targets were ignored; 0 when none is valid (zero gradients).
  const double rescale =
      loss_sum.count > 0 ? static_cast<double>(positions) / static_cast<double>(loss_sum.count) : 0.0;
  const double grad_norm = params_->finish_step() * rescale;
  times.optimizer += clock.compute();
  const bool finite = std::isfinite(loss) && std::isfinite(grad_norm);
  if (finite) {
    skipped_in_a_row_ = 0;
    ++optimizer_steps_;
  } else {
    skip_nonfinite(fmt::format("step {}: loss {} and gradient norm {}", step_ + 1, loss, grad_norm));
  }
  ++step_;
  tokens_ += config_.tokens_per_step();
  if (finite) {
    fault::point("optimizer", dist_.rank(), step_);
    params_->apply_update(optimizer_, schedule_.at(step_), optimizer_steps_,
                          rescale * optim::clip_factor(grad_norm, config_.train.grad_clip));
    times.optimizer += clock.compute();
  }
  times.comm_tp = params_->tp_comm_seconds() - tp0;
  times.comm_pp = pipeline_->blocked_seconds() - pp0;
  return StepStats{step_,   loss,    schedule_.at(step_), grad_norm, now_seconds() - t0, times, positions,
                   signals, !finite, skipped_total_};
}

model::LossSum Trainer::accumulate_gradients(const BatchSource& next, int64_t positions, PhaseClock& clock,
                                             StepTimes& times) {
  const auto batch = [&](int micro_batch) {
    const data::Loader::Batch b = next();
    times.data_wait += clock.compute();
    if (micro_batch == 0) fault::point("forward", dist_.rank(), step_ + 1);
    return b;
  };
  PipelineStageRunner::Hooks hooks;
  hooks.before = [&](const PipelineOp& op) {
    params_->begin_micro_batch(op.micro_batch);
    if (!op.forward && op.micro_batch == config_.accumulation_steps() - 1 &&
        fault::point("backward", dist_.rank(), step_ + 1) == fault::Kind::kNan) {
      params_->poison_next_gradients();
    }
  };
  hooks.after = [&](const PipelineOp& op, double head_backward_seconds) {
    params_->backend().synchronize();  // work a GPU still has queued belongs to this phase
    const double seconds = clock.compute();
    (op.forward ? times.forward : times.backward) += seconds - head_backward_seconds;
    times.backward += head_backward_seconds;
  };
  return pipeline_->step(*params_, batch, hooks, 1.0f / static_cast<float>(positions));
}

void Trainer::share_step_figures(model::LossSum* loss_sum, uint32_t* signals) {
  // Every rank logs, and stops on, the same global loss and signals, and sees every rank's busy
  // time and memory: [loss sum, valid targets, signal bits..., busy of rank 0..W-1, RSS MiB...,
  // peak RSS MiB...] summed over ranks, the loss over one rank per dp coordinate (counts_loss).
  // A float holds the count exactly up to 2^24 targets per step, and to 6e-8 relative beyond.
  constexpr int kBits = kSignalBits;
  constexpr double kMiB = 1 << 20;
  const int world = dist_.world_size(), rank = dist_.rank();
  float* sums = reduce_buffer_.data();
  float* bits = sums + 2;
  float* busy = bits + kBits;
  float* rss = busy + world;
  float* peak = rss + world;
  std::fill(reduce_buffer_.begin(), reduce_buffer_.end(), 0.0f);
  if (counts_loss()) {
    sums[0] = static_cast<float>(loss_sum->sum);
    sums[1] = static_cast<float>(loss_sum->count);
  }
  for (int b = 0; b < kBits; ++b) bits[b] = static_cast<float>(*signals >> b & 1u);
  busy[rank] = static_cast<float>(rank_busy_[rank]);
  rss[rank] = static_cast<float>(std::round(static_cast<double>(rank_rss_[rank]) / kMiB));
  peak[rank] = static_cast<float>(std::round(static_cast<double>(rank_peak_rss_[rank]) / kMiB));
  dist_.world()
      ->all_reduce(sums, static_cast<int64_t>(reduce_buffer_.size()), comm::DType::kF32,
                   {comm::Millis(config_.parallel.timeout_ms)})
      ->wait();
  *loss_sum = {sums[0], static_cast<int64_t>(std::llround(sums[1]))};
  *signals = 0;
  for (int b = 0; b < kBits; ++b) *signals |= bits[b] > 0.0f ? 1u << b : 0u;
  for (int r = 0; r < world; ++r) {
    rank_busy_[r] = busy[r];
    rank_rss_[r] = static_cast<int64_t>(rss[r] * kMiB);
    rank_peak_rss_[r] = static_cast<int64_t>(peak[r] * kMiB);
  }
}

void Trainer::skip_nonfinite(const std::string& what) {
  if (config_.train.on_nonfinite != config::OnNonFinite::kSkip) {
    throw NonFiniteError(what +
                         "; parameters are unchanged (try a lower train.lr or train.grad_clip, or "
                         "train.on_nonfinite = \"skip\")");
  }
  if (++skipped_in_a_row_ > config_.train.max_skipped_steps) {
    throw NonFiniteError(
        fmt::format("{}: {} steps in a row were not finite (train.max_skipped_steps = {}); "
                    "parameters are unchanged (try a lower train.lr or train.grad_clip)",
                    what, skipped_in_a_row_, config_.train.max_skipped_steps));
  }
  // The gradients are dropped (begin_step zeroes them); the schedule and data move on, AdamW's
  // step count (its bias correction) does not.
  ++skipped_total_;
  log::warn("{}: update skipped (train.on_nonfinite = skip; {} in a row, {} in all)", what, skipped_in_a_row_,
            skipped_total_);
}

bool Trainer::counts_loss() const {
  const parallel::Mesh& m = *dist_.mesh;
  return m.rank(parallel::Dim::kTp) == 0 && m.rank(parallel::Dim::kPp) == m.size(parallel::Dim::kPp) - 1;
}

int64_t Trainer::validation_batches() const {
  // Synthetic tokens are an endless seeded stream: no split to cover.
  if (!val_stream_) return config_.train.eval_batches;
  const uint64_t samples = val_tokens_ > 0 ? (val_tokens_ - 1) / static_cast<uint64_t>(config_.model.seq_len) : 0;
  const uint64_t G = static_cast<uint64_t>(config_.train.batch_size);
  return static_cast<int64_t>((samples + G - 1) / G);
}

Trainer::Evaluation Trainer::evaluate(int64_t batches) {
  // The first `batches` global batches of consecutive samples (T+1 tokens each) from the start of
  // the validation split, cut among ranks as training batches are, so the figure does not depend
  // on the world size. Rows past the split's end are padded with ignored targets and every rank
  // runs the same number of forwards (they are collectives when sharded).
  const int64_t T = config_.model.seq_len, mb = config_.micro_batch(), G = config_.train.batch_size;
  const int W = dist_.mesh->size(parallel::Dim::kDp), rank = dist_.mesh->rank(parallel::Dim::kDp);
  const uint64_t samples = val_tokens_ > 0 ? (val_tokens_ - 1) / static_cast<uint64_t>(T) : 0;
  if (samples == 0) throw DataError(fmt::format("validation split has {} tokens: fewer than seq_len + 1", val_tokens_));
  if (batches <= 0) batches = config_.train.eval_batches;
  const uint64_t total = std::min<uint64_t>(samples, static_cast<uint64_t>(batches) * static_cast<uint64_t>(G));
  const uint64_t global_batches = (total + G - 1) / G;
  const int64_t per_rank = G / W;
  model::LossSum loss;
  for (uint64_t b = 0; b < global_batches; ++b) {
    // Micro-batch j of this rank's part of global batch b (the stages of a pipeline read the same).
    const auto batch = [&](int j) {
      for (int64_t r = 0; r < mb; ++r) {
        const uint64_t s = b * G + rank * per_rank + j * mb + r;
        int32_t* in = eval_inputs_.data() + r * T;
        int32_t* tg = eval_targets_.data() + r * T;
        if (s < total) {
          val_reader_(s * T, T, in);
          val_reader_(s * T + 1, T, tg);
        } else {
          std::fill(in, in + T, 0);
          std::fill(tg, tg + T, -1);
        }
      }
      return data::Loader::Batch{eval_inputs_.data(), eval_targets_.data()};
    };
    const model::LossSum part = pipeline_->forward_only(*params_, batch);
    loss.sum += part.sum;
    loss.count += part.count;
  }
  if (dist_.world() != nullptr) {
    // Per-rank sums in double precision, reduced as floats: 6e-8 relative.
    float sums[2] = {0.0f, 0.0f};
    if (counts_loss()) sums[0] = static_cast<float>(loss.sum), sums[1] = static_cast<float>(loss.count);
    dist_.world()->all_reduce(sums, 2, comm::DType::kF32, {comm::Millis(config_.parallel.timeout_ms)})->wait();
    loss = {sums[0], static_cast<int64_t>(std::llround(sums[1]))};
  }
  return {loss.mean(), loss.count};
}

}  // namespace tessera::train
