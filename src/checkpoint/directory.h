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
#include "model/layout.h"

namespace tessera::checkpoint {

std::string step_dir_name(int64_t step);     // "step_00001200"
// "shard_00003.bin"; under tensor parallelism (tensor_parallel > 1) "tp01_shard_00003.bin";
// under pipeline parallelism (pipeline_parallel > 1) "pp01_tp00_shard_00003.bin".
std::string shard_file_name(int shard_rank, int tp_rank = 0, int tensor_parallel = 1, int pp_rank = 0,
                            int pipeline_parallel = 1);

// Steps with a committed directory (a manifest is present) under root, ascending.
std::vector<int64_t> committed_steps(const std::string& root);
// The step ROOT/latest names; -1 when there is none. Throws DataError when it is not a number.
int64_t read_latest(const std::string& root);
// Replaces ROOT/latest atomically (temporary file, fsync, rename, fsync of the directory).
void write_latest(const std::string& root, int64_t step);
// The committed checkpoint `path` names: itself when it holds a manifest, else the one `latest`
// names in path or path/checkpoints (a checkpoint root or a run directory); "" when none. An
// s3:// URL names a step (s3://B/P/RUN/step_N) or a tier root (s3://B/P/RUN).
std::string checkpoint_in(const std::string& path);
// Removes step directories that hold no manifest (a save that never committed), except the one
// of step `in_progress`, and stray temporary files. Returns the bytes freed.
uint64_t remove_uncommitted(const std::string& root, int64_t in_progress = -1);
// Removes the oldest committed checkpoints so that `keep` remain; never the one `latest` names,
// nor step `in_use` (one being uploaded, say; a later prune takes it).
void prune(const std::string& root, int keep, int64_t in_use = -1);

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

// Shard file `f` of the committed checkpoint step_dir (a directory, or an s3:// step URL whose
// manifest places each file in an object).
std::unique_ptr<ShardFile> open_shard(const std::string& step_dir, const ManifestFile& f);

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
  // Elements [begin, begin + count) of tp rank `tp_rank`'s flat buffer `kind` ("param",
  // "exp_avg", "exp_avg_sq") of unit `unit`, as one contiguous buffer of any padding: elements at
  // or past the unit's numel are zero. This is how a checkpoint written at one shard size loads
  // at another.
  void read_slice(int tp_rank, int unit, const char* kind, int64_t begin, int64_t count, float* out);
  // The manifest's index of the unit named `name`; throws DataError when it holds none.
  int unit_index(const std::string& name) const;
  // The same for the unit as `to` lays it out (its tensors, whole or a tensor-parallel block of
  // any size): each tensor's part is put together from the blocks the checkpoint holds, padding
  // is zero. `unit` is the manifest's index of it (unit_index); `to`'s tensors must be the
  // manifest's, by name and whole shape.
  void read_for(const model::UnitLayout& to, int to_tp_rank, int unit, const char* kind, int64_t begin, int64_t count,
                float* out);
  // Every tensor of buffer `kind` by name, whole (consolidated from all shards and tp blocks).
  std::vector<NamedTensor> tensors(const char* kind);
  std::vector<NamedTensor> parameters() { return tensors("param"); }

 private:
  ShardFile& shard(int pp_rank, int tp_rank, int shard_rank);
  // The entry of shard file (u's stage, tp_rank, shard_rank) for unit u's `kind`, checked to hold
  // padded / shard_size floats.
  const ShardEntry& slice_entry(int tp_rank, int shard_rank, const ManifestUnit& u, const char* kind);
  // The entry read whole (checksum checked), kept until another entry of the same tp rank is read.
  const std::vector<float>& cached_entry(int tp_rank, int shard_rank, int unit, const char* kind);

  struct Cached {
    int shard_rank = -1, unit = -1;
    std::string kind;
    std::vector<float> data;
  };
  std::string dir_;
  Manifest manifest_;
  std::map<int, std::unique_ptr<ShardFile>> shards_;  // by (pp_rank x tp + tp_rank) x shard_size + shard_rank
  std::vector<Cached> cache_;                         // one per tp rank
};

// Throws DataError naming step_dir unless the checkpoint holds `layout`'s model: as many units as
// the whole model has, and the layout's units (one pipeline stage's, or all) among them by name,
// with the same tensors by name and whole shape (tensors are matched whole: a checkpoint saved at
// another tensor-parallel size holds other blocks of them, which CheckpointReader::read_for
// re-cuts).
void check_same_model(const Manifest& m, const model::ModelLayout& layout, const std::string& step_dir);

// A layout's unit as the manifest records it, held by pipeline stage pp_rank.
ManifestUnit manifest_unit(const model::UnitLayout& unit, int pp_rank);

// A manifest tensor as a layout describes it (its block at tp rank 0; blocks of other ranks have
// the same shape and offset).
model::TensorSpec tensor_spec(const ManifestTensor& t);

}  // namespace tessera::checkpoint
