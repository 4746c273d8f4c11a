// A checkpoint's manifest.json: what a step directory holds and the training state to resume
// from. Its presence is the commit: a step directory without one is never loaded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::checkpoint {

struct ManifestTensor {
  std::string name;            // e.g. "layers.0.attention.wq.weight"
  std::vector<int64_t> shape;  // one tensor-parallel rank's block
  int64_t offset = 0;          // floats from the start of its unit
  int split_dim = -1;          // the dimension cut among tensor-parallel ranks; -1: replicated
  std::vector<int64_t> full_shape;  // the whole tensor
};

// A unit's flat buffer, the same size on every tensor-parallel rank (each holds its blocks):
// `numel` floats of tensors, zero-padded to `padded`, cut into shard_size equal slices, slice k of
// tp rank t's in the shard file of (pp_rank, t, k).
struct ManifestUnit {
  std::string name;  // "embedding", "block.3", "head"
  int pp_rank = 0;   // the pipeline stage that holds it
  int64_t numel = 0;
  int64_t padded = 0;
  std::vector<ManifestTensor> tensors;
};

// Shard files are numbered by their coordinate: (pp_rank x tensor_parallel + tp_rank) x shard_size
// + shard_rank.
struct FileCoord {
  int pp_rank = 0, tp_rank = 0, shard_rank = 0;
};
int file_number(const FileCoord& c, int tensor_parallel, int shard_size);
FileCoord file_coord(int number, int tensor_parallel, int shard_size);

struct ManifestFile {
  // "shard_00000.bin" ("tp01_shard_00000.bin" under tp, "pp01_tp00_shard_00000.bin" under pp),
  // relative to the step directory
  std::string name;
  int pp_rank = 0;
  int tp_rank = 0;
  int shard_rank = 0;
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
  // In an object-store copy (checkpoint/object_tier.h) the file is bytes [object_offset,
  // object_offset + bytes) of the object `object` (a key in the bucket of the step's URL); "" in
  // a directory.
  std::string object{};
  uint64_t object_offset = 0;
};

struct Manifest {
  // Version 2 added tensor and pipeline parallelism (tensor_parallel, pipeline_parallel, a file's
  // pp_rank and tp_rank, a unit's pp_rank, a tensor's split_dim and full_shape); version 1
  // manifests read as one stage and one tp rank.
  static constexpr int kVersion = 2;
  int64_t step = 0;               // optimizer steps taken, skipped ones included
  int64_t optimizer_steps = 0;    // AdamW updates applied (its bias correction): step less the skipped
  int64_t tokens = 0;             // training tokens seen
  uint64_t sampler_position = 0;  // global sample position of the next batch
  uint64_t seed = 0;              // initialization and data-order seed (all RNG is counter-based)
  // The schedule (optim/schedule.h): warmup_steps up to lr, then `decay` (train.lr_decay's name)
  // to min_lr at total_steps over the last decay_steps steps (0: every step after the warmup).
  double lr = 0, min_lr = 0;
  int64_t warmup_steps = 0, total_steps = 0;
  std::string decay = "cosine";
  int64_t decay_steps = 0;
  int world = 1;                  // ranks that trained
  int shard_size = 1;             // ranks each unit was sharded over (one file per shard rank)
  int tensor_parallel = 1;        // tensor-parallel ranks (one set of shard files each)
  int pipeline_parallel = 1;      // pipeline stages (one set of shard files each, with its units)
  std::string strategy;
  std::string config_toml;        // the resolved config of the run
  std::string created;            // UTC time, ISO 8601
  std::vector<ManifestUnit> units;
  std::vector<ManifestFile> files;

  // What a shard file holds of each unit, in this order.
  static constexpr const char* kKinds[3] = {"param", "exp_avg", "exp_avg_sq"};
  // "<unit>.param", "<unit>.exp_avg", "<unit>.exp_avg_sq": the tensors of each shard file.
  static std::string tensor_name(const std::string& unit, const char* kind) { return unit + "." + kind; }
  const ManifestFile* file_of(int pp_rank, int tp_rank, int shard_rank) const;
  // The index in `units` of the unit named `name`; -1 when there is none.
  int unit_index(const std::string& name) const;
};

std::string to_json(const Manifest& manifest);
// Parses and checks the manifest (types, ranges, one file per shard rank, tensors inside their
// units); throws DataError naming `origin` and the key.
Manifest parse_manifest(const std::string& text, const std::string& origin);
// Reads DIR/manifest.json (DIR a directory or an s3:// step URL); throws DataError (IoError when
// unreadable) naming the file.
Manifest read_manifest(const std::string& step_dir);

}  // namespace tessera::checkpoint
