// `tessera train`: the step loop with progress lines, validation, RUN/metrics.jsonl and final
// weights; and loading a finished run back for `generate` and `eval`.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "config/config.h"
#include "parallel/job.h"

namespace tessera::train {

// Trains to train.max_steps (or train.max_tokens), writing into RUN_DIR: config.toml,
// metrics.jsonl, run.json (what the run used: dataset directory, tokenizer), a copy of the
// dataset's tokenizer.model or tokenizer.json (when training on a dataset), sharded checkpoints
// in RUN_DIR/checkpoints and, when checkpoint.save_final, model.safetensors with the resolved
// config in its metadata. resume: "" starts afresh (refused when RUN_DIR already holds a committed checkpoint), "auto"
// continues from RUN_DIR's latest checkpoint if there is one, else a checkpoint path. SIGTERM or
// SIGINT finishes the step, saves a checkpoint and returns normally. Holds RUN_DIR's lock
// (RunLock): a second run there is refused (exit 2). Throws tessera::Error subclasses for faults.
// One process (parallel.nproc = 1); several are `launch::run_local_job`.
void run_training(const config::Config& config, const std::string& run_dir, const std::string& resume = "");

// One rank of a job that something else started (`tessera launch`, Slurm, torchrun-style
// variables): joins the job at `job`, trains, checkpoints; rank 0 serves the job's store when it
// is a tcp:// URL. parallel.nproc must equal job.world. heartbeat: a file rewritten after every
// step for the agent ("" for none). resume: as run_training's, "none" meaning "". Without an
// agent (no heartbeat file) the ranks share the run directory's lock (RunLock) as one job.
void run_worker(const config::Config& config, const std::string& run_dir, const parallel::JobAddress& job,
                const std::string& heartbeat, std::string resume);

// The dataset directory a config trains on: "" for synthetic data, the prepared bundled corpus
// for "bundled" (preparing it on first use), else data.dataset itself.
std::string resolve_dataset(const config::Config& config);

// A trained model loaded back: from a run directory (its model.safetensors, else its latest
// checkpoint; its tokenizer and run.json), a checkpoint directory (step_N or a checkpoint root
// with `latest`), or a weights file (the config comes from its metadata; the tokenizer from
// `tokenizer`, else tokenizer.model or tokenizer.json beside it).
struct TrainedModel {
  config::Config config;
  std::vector<checkpoint::NamedTensor> tensors;
  std::string weights_path;
  std::string tokenizer_path;  // "" when none was found
  std::string dataset;         // the dataset the run trained on, "" when unknown
};
// Throws DataError naming the file that is missing or malformed.
TrainedModel load_trained(const std::string& checkpoint, const std::string& tokenizer = "");

}  // namespace tessera::train
