// Layer config: the typed configuration and its validation. It must not know how any key is used
// at run time.
//
// Run configuration: TOML sections [model] [train] [data] [parallel] [checkpoint] [metrics],
// overridable per key from the command line (`--set train.lr=1e-3`), validated strictly before
// any work starts. Every error is a ConfigError naming the key and value (exit code 2).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/log.h"
#include "model/model_config.h"

namespace tessera::config {

// Enum-like keys are parsed once, when the config is loaded (config.cc holds each one's table
// of names, the only place a name is spelled); use sites compare enums, never strings. name()
// gives the spelling back (logs, run.json, to_toml).
//
// How data-parallel ranks hold a unit's parameters (ARCHITECTURE.md, "Sharding math"):
//   full_shard     shard over every data-parallel rank; gather for forward, free, gather again
//   shard_grad_op  the same, keeping the gathered parameters from forward until backward is done
//   hybrid_shard   full_shard inside groups of parallel.shard_group_size ranks, replicated across
//   no_shard       every rank holds all parameters; gradients all-reduced (DDP)
enum class Strategy { kFullShard, kShardGradOp, kHybridShard, kNoShard };
enum class Precision { kFp32, kBf16 };      // "fp32", "bf16"
enum class OnNonFinite { kStop, kSkip };    // "stop", "skip"
enum class OnFailure { kContinue, kStop };  // "continue", "stop"
// The order of a pipeline stage's forwards and backwards (train/pipeline.h): "1f1b" (one forward,
// one backward; at most P - s micro-batches' activations on stage s) or "gpipe" (all forwards,
// then all backwards; all m).
enum class PipelineSchedule { kOneFOneB, kGPipe };
// Where a process computes (train/device.h): "auto" (a GPU when this build has CUDA, one is
// visible and the job is one process; the CPU otherwise), "cpu" or "cuda".
enum class Device { kAuto, kCpu, kCuda };
// How the ranks' host-memory collectives travel (comm::HostTransport): "auto" (shared memory
// between ranks on one host, else TCP), "tcp" or "shm".
enum class HostTransport { kAuto, kTcp, kShm };
// Where a CPU job's ranks run on their node: "auto" (each local rank on its own block of the
// node's CPUs) or "none" (wherever the kernel puts them).
enum class CpuBind { kAuto, kNone };
// The learning rate's decay after the warmup (optim::Schedule): "cosine", "linear", "sqrt" or "none".
enum class LrDecay { kCosine, kLinear, kSqrt, kNone };
const char* name(Strategy v);
const char* name(Precision v);
const char* name(OnNonFinite v);
const char* name(OnFailure v);
const char* name(PipelineSchedule v);
const char* name(Device v);
const char* name(HostTransport v);
const char* name(CpuBind v);
const char* name(LrDecay v);
const char* name(model::RopeScaling v);
// train.device's values spelled as on the command line; a ConfigError naming `what` otherwise.
Device parse_device(const std::string& text, const std::string& what);

struct TrainConfig {
  int64_t batch_size = 16;       // global sequences per optimizer step
  int64_t micro_batch_size = 0;  // sequences per forward on one rank; 0: batch_size / data-parallel ranks
  int64_t max_steps = 1000;
  int64_t max_tokens = 0;  // 0: no token limit
  double lr = 2e-3;
  double min_lr = 2e-4;
  int64_t warmup_steps = 50;
  // The learning rate after the warmup (optim/schedule.h): "cosine", "linear" or "sqrt" decay to
  // min_lr at max_steps, or "none" (lr to the end). The decay takes every step after the warmup,
  // or with lr_decay_steps = K > 0 only the last K, the peak held until then (warmup-stable-decay).
  LrDecay lr_decay = LrDecay::kCosine;
  int64_t lr_decay_steps = 0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global grad-norm clip; 0 disables
  // A step whose global loss or gradient norm is not finite: "stop" the run (exit 11), or
  // "skip" its update (parameters and optimizer state unchanged; the batch is dropped).
  OnNonFinite on_nonfinite = OnNonFinite::kStop;
  int64_t max_skipped_steps = 5;  // with skip: the next non-finite step after this many in a row stops
  int64_t seed = 1234;
  Device device = Device::kAuto;
  int64_t threads = 0;          // per process; 0: one per available core
  int64_t eval_interval = 100;  // steps between validation losses (and at the end); 0: never
  int64_t eval_batches = 8;     // global batches of the validation split per evaluation
  // Initial weights instead of the seeded random init: a Hugging Face Llama directory
  // (config.json + safetensors), a run directory or a model.safetensors written by
  // `tessera train`. Its model shape must equal [model]'s; "" for random init.
  std::string init_from;
};

struct DataConfig {
  // A directory written by `tessera prepare`; "bundled" is the corpus that ships in data/,
  // tokenized on first use into cache_dir.
  std::string dataset = "bundled";
  std::string cache_dir = "runs/cache";
  bool synthetic = false;  // seeded random tokens of the model's vocabulary instead
};

struct ParallelConfig {
  int64_t nproc = 1;  // worker processes in the job: pipeline x tensor x the data-parallel ranks
  // Tensor-parallel ranks (Megatron-LM's split: heads, hidden units and the vocabulary divided
  // among them); must divide nproc, model.n_heads, model.n_kv_heads, model.ffn_hidden and
  // model.vocab_size. The data-parallel ranks are nproc / (pipeline x tensor).
  int64_t tensor = 1;
  // Megatron-LM's sequence parallelism, with tensor > 1: the residual stream, the norms and their
  // saved outputs cut by tokens among the tensor-parallel ranks (their activation memory /
  // tensor), an all-gather before and a reduce-scatter after each split product instead of the
  // all-reduces (the same bytes forward; backward half as many again, as the norm outputs are
  // gathered a second time for the weight gradients). train.micro_batch_size x model.seq_len must
  // be divisible by tensor. No effect with tensor = 1.
  bool sequence_parallel = false;
  // Pipeline stages: the blocks cut into this many consecutive groups, balanced by cost (the
  // embedding on the first stage, the final norm and LM head on the last); the micro-batches of a
  // step (accumulation_steps()) flow through them by pipeline_schedule. At most model.n_layers.
  // With tied embeddings the last stage holds a copy of the table (fsdp::ShardedParams).
  int64_t pipeline = 1;
  PipelineSchedule pipeline_schedule = PipelineSchedule::kOneFOneB;
  // Blocks per stage, first to last (e.g. [6, 2]), adding up to model.n_layers; empty: balanced
  // by FLOPs (model::balanced_stage_layers).
  std::vector<int64_t> pipeline_layers;
  // full_shard, shard_grad_op, hybrid_shard (shard inside groups of shard_group_size ranks,
  // replicate across groups) or no_shard.
  Strategy strategy = Strategy::kFullShard;
  int64_t shard_group_size = 0;  // hybrid_shard only; 0: every data-parallel rank
  int64_t timeout_ms = 300000;   // every collective
  // The host groups' collectives (Gloo's, and every group of a CPU job): "auto" moves them
  // through one shared-memory segment per group when all its ranks are on one host (and its
  // /dev/shm has room), else over TCP; "tcp" always over TCP; "shm" fails at start-up, naming
  // the ranks, where memory cannot be shared. Point-to-point transfers stay on TCP.
  HostTransport host_transport = HostTransport::kAuto;
  // A CPU job with several ranks on a node, started by Tessera (`tessera launch`, `--nproc`):
  // "auto" binds local rank i of n (its compute threads and its collectives' workers) to the i-th
  // of n equal blocks of the CPUs the agent may run on, so that ranks neither share a core nor
  // migrate, and equal ranks keep step with each other; it binds nothing where there are fewer
  // CPUs than ranks, or where train.threads asks for more threads than a block has. "none"
  // leaves placement to the kernel. Ranks that srun or torchrun start are theirs to place.
  CpuBind cpu_bind = CpuBind::kAuto;
  // The health check before step 0 on a GPU: its device memory bandwidth (a device-to-device copy,
  // bytes read + written per second) must reach this floor, in GB/s (0: measured and logged only).
  double health_min_memory_gbps = 0;
  // What parameters are all-gathered in and gradients reduced in: fp32 or bf16 (half the bytes).
  // param_dtype = bf16 is also mixed-precision compute (PyTorch FSDP's MixedPrecision with
  // param_dtype bf16, at any world size, 1 included): every weight GEMM reads bf16 weights and
  // bf16-rounded activations and accumulates in fp32; norms, RoPE, attention, SwiGLU, the loss,
  // gradients, master weights and optimizer state stay fp32.
  Precision param_dtype = Precision::kFp32;
  Precision reduce_dtype = Precision::kFp32;
  // 0: keep every block's activations; k: keep only the inputs of blocks 0, k, 2k, ... and
  // recompute their other activations in backward (1 = every block).
  int64_t activation_checkpointing = 0;
};

// Sharded checkpoints in RUN/checkpoints (ARCHITECTURE.md, "Checkpoints"): saved every
// interval_steps steps and/or every interval_minutes minutes, at the end, and on SIGTERM.
struct CheckpointConfig {
  bool save_final = true;               // write RUN/model.safetensors at the end of training
  int64_t interval_steps = 0;           // 0: no step interval
  double interval_minutes = 30;         // 0: no time interval; with both 0, only SIGTERM saves
  int64_t keep = 3;                     // committed checkpoints kept; the newest is never deleted
  bool fallback = true;                 // resume skips a damaged checkpoint for the previous committed one
  // After each commit, copied here in the background: a directory (a verified copy), or
  // s3://BUCKET/PREFIX, the durable object-store tier (checkpoint/object_tier.h). Either way
  // under the run directory's name.
  std::string mirror_dir;
  int64_t s3_prefixes = 1;  // hashed key prefixes the tier spreads objects over (S3's per-prefix request rates)
  OnFailure on_failure = OnFailure::kContinue;  // a failed save: continue training or stop (exit 10)
  bool enabled() const { return interval_steps > 0 || interval_minutes > 0; }
};

struct MetricsConfig {
  log::Level log_level = log::Level::kInfo;
  int64_t log_interval = 10;  // steps between progress lines
  // A rank busier than straggler_factor x the median of the others for straggler_steps steps
  // in a row is flagged as a straggler (log and metrics.jsonl).
  double straggler_factor = 2.0;
  int64_t straggler_steps = 5;
  // Per-rank peak FLOP/s that MFU is measured against: > 0 as given; 0 measured at start (CPU
  // GEMM calibration; a GPU's datasheet peak); < 0 no MFU (docs/metrics.md).
  double peak_flops = 0.0;
  // Rank 0 serves Prometheus metrics on prometheus_host:prometheus_port (0: off).
  std::string prometheus_host = "127.0.0.1";
  int64_t prometheus_port = 0;
};

struct Config {
  model::ModelConfig model;
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  CheckpointConfig checkpoint;
  MetricsConfig metrics;

  // Derived from the above by validate(). Each data-parallel rank (the ranks of a tensor-parallel
  // group and the stages of a pipeline read the same batch) takes batch_size / data_parallel() sequences per
  // step, in accumulation_steps() micro-batches of micro_batch().
  int64_t data_parallel() const { return parallel.nproc / (parallel.tensor * parallel.pipeline); }
  int64_t accumulation_steps() const { return train.batch_size / (data_parallel() * micro_batch()); }
  int64_t micro_batch() const {
    return train.micro_batch_size > 0 ? train.micro_batch_size : train.batch_size / data_parallel();
  }
  int64_t tokens_per_step() const { return train.batch_size * model.seq_len; }
  // Sequence parallelism in effect: set, and tensor parallelism to apply it to.
  bool sequence_parallel() const { return parallel.sequence_parallel && parallel.tensor > 1; }
};

// "key=value" pairs in the order given, e.g. from repeated --set flags.
using Overrides = std::vector<std::pair<std::string, std::string>>;

// Defaults, then the TOML file (when path is not empty), then overrides; model.preset is applied
// before any other model key wherever it appears. Throws ConfigError; the result is validated.
Config load(const std::string& path, const Overrides& overrides);
// The same from TOML text; `origin` names it in messages (e.g. the checkpoint it came from).
Config load_text(const std::string& toml_text, const std::string& origin, const Overrides& overrides);
// Parses "key=value"; throws ConfigError when there is no '='.
std::pair<std::string, std::string> parse_override(const std::string& text);
// The values a numeric key accepts (from lo to hi, each end open or closed; a floating-point key
// must also be finite). validate() checks every key's range before the rules between keys.
struct Bounds {
  double lo, hi;
  bool lo_open, hi_open;
  const char* note;  // what the special values mean, e.g. "0: off"; "" when none
  bool contains(double v) const { return (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi); }
};
// Every numeric key with its range, in schema order.
std::vector<std::pair<std::string, Bounds>> numeric_key_bounds();
// Checks ranges and consistency; throws ConfigError naming the key.
void validate(const Config& config);
// The resolved configuration as TOML, every key present.
std::string to_toml(const Config& config);

}  // namespace tessera::config
