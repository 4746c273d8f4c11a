// Resuming a run: which committed checkpoint to load, agreed by every rank, and loading it into
// this rank's shards at any world size or strategy, with fallback past damaged ones.
#pragma once

#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "config/config.h"
#include "parallel/job.h"

namespace tessera::checkpoint {

// Where to resume from: the committed checkpoint directories to try, best first. `spec` is
// "auto" (RUN/checkpoints/latest; with checkpoint.fallback the older committed ones after it; this
// run's mirror's when RUN has none) or a path to a step directory or a checkpoint root. Empty when
// "auto" finds nothing. Throws DataError when an explicit path holds no committed checkpoint.
std::vector<std::string> resume_candidates(const config::Config& config, const std::string& root,
                                           const std::string& spec);
// resume_candidates as rank 0 sees them, on every rank (broadcast): a rank that listed the
// directory itself could read another `latest` (NFS attribute caching, a racing writer) and
// load another step. Rank 0's DataError is thrown on every rank.
std::vector<std::string> agreed_resume_candidates(const config::Config& config, const std::string& root,
                                                  const std::string& spec, const parallel::Distributed& dist);
// Loads a committed checkpoint: this rank's slices of parameters and moments into `into` (re-cut
// for its world size and strategy), and returns the step, tokens and data position it was saved
// at. Throws DataError naming the file and tensor when something is damaged or was written for
// another model. `config` is the run's (a different train.seed is warned about).
TrainingState load_checkpoint(const std::string& step_dir, const RankShards& into, const config::Config& config);
// Tries the candidates in order; every rank loads the same one (they agree through an all-reduce).
// A damaged candidate (DataError: checksum, truncation, a missing file) is moved aside by rank 0
// (STEP.damaged-TIME, named in the log) when an older one is tried next, never deleted. A read
// that fails (IoError: EIO, ESTALE) is retried with backoff, then every rank throws IoError
// (exit 10) naming the file: the checkpoint may be sound, so the run neither falls back from it
// nor lets an older one replace it. Returns the directory loaded and sets *state to what it
// holds. Throws DataError when none loads (after trying the older ones only when
// checkpoint.fallback is set).
std::string resume_from(const RankShards& into, const config::Config& config, const parallel::Distributed& dist,
                        const std::vector<std::string>& candidates, TrainingState* state);

}  // namespace tessera::checkpoint
