// A run's checkpoint directory (ARCHITECTURE.md, "Checkpoints"):
//   ROOT/step_NNNNNNNN/{shard_00000.bin, ..., manifest.json}   committed when manifest.json exists
//   ROOT/latest                                                the newest committed step, as text
// and reading a committed checkpoint back at any shard size.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_file.h"

namespace tessera::checkpoint {

std::string step_dir_name(int64_t step);     // "step_00001200"
std::string shard_file_name(int shard_rank);  // "shard_00003.bin"

// Steps with a committed directory (a manifest is present) under root, ascending.
std::vector<int64_t> committed_steps(const std::string& root);
// The step ROOT/latest names; -1 when there is none. Throws DataError when it is not a number.
int64_t read_latest(const std::string& root);
// Replaces ROOT/latest atomically (temporary file, fsync, rename, fsync of the directory).
void write_latest(const std::string& root, int64_t step);
// The committed checkpoint `path` names: itself when it holds a manifest, else the one `latest`
// names in path or path/checkpoints (a checkpoint root or a run directory); "" when none.
std::string checkpoint_in(const std::string& path);
// Removes step directories that hold no manifest (a save that never committed), except the one
// of step `in_progress`, and stray temporary files. Returns the bytes freed.
uint64_t remove_uncommitted(const std::string& root, int64_t in_progress = -1);
// Removes the oldest committed checkpoints so that `keep` remain; never the one `latest` names.
void prune(const std::string& root, int keep);

// Where a run's checkpoints are mirrored: MIRROR_DIR/NAME, NAME the run directory's own name
// (RUN is root's parent; symlinks resolved, so runs/latest names the run it points to). Runs
// that share a mirror_dir never prune, overwrite or resume each other's copies, and a run
// restarted elsewhere with the same --run-dir finds its own. "" when mirror_dir is "". Throws
// ConfigError when the run directory has no name (/).
std::string mirror_root(const std::string& mirror_dir, const std::string& root);
// Throws ConfigError (exit 2) when a fresh run would start in RUN (RUN/checkpoints) or over its
// mirror while either holds a committed checkpoint (named by `latest`, or a step whose first
// commit died before `latest` was written): called before anything is written, so a refused run
// changes nothing.
void refuse_fresh_run_over_checkpoints(const std::string& run_dir, const std::string& mirror_dir);

// Removes committed checkpoints newer than `step`: after resuming from `step` they belong to an
// abandoned timeline (e.g. a commit whose `latest` update was cut short) and would be overwritten.
void remove_newer(const std::string& root, int64_t step);

// Checks a committed checkpoint: the manifest parses, every file has the recorded size and
// checksum, every tensor its own checksum. Returns one line per problem, naming the file and
// tensor; empty when the checkpoint is sound.
std::vector<std::string> verify(const std::string& step_dir);

// A committed checkpoint opened for loading. Shard files are opened on first use, and every
// tensor read is checked against its checksum.
class CheckpointReader {
 public:
  explicit CheckpointReader(const std::string& step_dir);  // reads the manifest; throws DataError
  ~CheckpointReader();
  const std::string& dir() const { return dir_; }
  const Manifest& manifest() const { return manifest_; }
  // Elements [begin, begin + count) of unit `unit`'s flat buffer `kind` ("param", "exp_avg",
  // "exp_avg_sq") as one contiguous buffer of any padding: elements at or past the unit's numel
  // are zero. This is how a checkpoint written at one shard size loads at another.
  void read_slice(int unit, const char* kind, int64_t begin, int64_t count, float* out);
  // Every parameter tensor by name (consolidated from all shards).
  std::vector<NamedTensor> parameters();

 private:
  ShardFile& shard(int shard_rank);
  // Shard `shard_rank`'s entry for unit u's `kind`, checked to hold padded / shard_size floats.
  const ShardEntry& slice_entry(int shard_rank, const ManifestUnit& u, const char* kind);

  std::string dir_;
  Manifest manifest_;
  std::map<int, std::unique_ptr<ShardFile>> shards_;
  std::vector<float> scratch_;
};

}  // namespace tessera::checkpoint
