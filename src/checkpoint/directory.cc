// Checkpoint directories: commit marker, listing, cleanup, verification and resharding reads.
#include "checkpoint/directory.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "checkpoint/object_tier.h"
#include "core/check.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/log.h"
#include "parallel/shard_range.h"
#include "storage/s3_client.h"

namespace tessera::checkpoint {
namespace {

namespace fs = std::filesystem;

// The step of a directory called step_NNNNNNNN, or -1.
int64_t step_of(const std::string& name) {
  if (name.size() != 13 || name.rfind("step_", 0) != 0) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

enum class Commit { kCommitted, kUncommitted, kUnknown };

// Whether a step directory holds its manifest. Only ENOENT means "never committed": any other
// error (EIO, ESTALE or EACCES from NFS or FUSE) is kUnknown, with errno in *err.
Commit commit_state(const fs::path& step_dir, int* err) {
  struct stat st;
  if (::lstat((step_dir / "manifest.json").c_str(), &st) == 0) return Commit::kCommitted;
  *err = errno;
  return errno == ENOENT ? Commit::kUncommitted : Commit::kUnknown;
}

uint64_t tree_bytes(const fs::path& p) {
  std::error_code ec;
  uint64_t bytes = 0;
  for (auto it = fs::recursive_directory_iterator(p, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec)) {
    if (it->is_regular_file(ec)) bytes += it->file_size(ec);
  }
  return bytes;
}

}  // namespace

std::string step_dir_name(int64_t step) { return fmt::format("step_{:08d}", step); }
std::string shard_file_name(int shard_rank, int tp_rank, int tensor_parallel, int pp_rank, int pipeline_parallel) {
  if (pipeline_parallel > 1) return fmt::format("pp{:02d}_tp{:02d}_shard_{:05d}.bin", pp_rank, tp_rank, shard_rank);
  if (tensor_parallel > 1) return fmt::format("tp{:02d}_shard_{:05d}.bin", tp_rank, shard_rank);
  return fmt::format("shard_{:05d}.bin", shard_rank);
}

std::vector<int64_t> committed_steps(const std::string& root) {
  std::vector<int64_t> steps;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const int64_t step = step_of(e.path().filename().string());
    if (step >= 0 && fs::exists(e.path() / "manifest.json", ec)) steps.push_back(step);
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t read_latest(const std::string& root) {
  std::ifstream in(root + "/latest");
  if (!in) return -1;
  std::string text;
  std::getline(in, text);
  const int64_t step = step_of(text);
  if (step < 0) throw DataError(fmt::format("{}/latest holds \"{}\", not a step directory name", root, text));
  return step;
}

void write_latest(const std::string& root, int64_t step) {
  write_file_atomic(root + "/latest", step_dir_name(step) + "\n");
}

std::string checkpoint_in(const std::string& path) {
  if (storage::is_s3(path)) {  // a step URL, or a tier root (MIRROR_DIR/RUN) whose `latest` names one
    if (storage::parse_s3(path, "checkpoint").name().rfind("step_", 0) == 0) return path;
    const int64_t latest = tier_read_latest(storage::default_s3_client(), path);
    return latest < 0 ? "" : storage::parse_s3(path, "checkpoint").child(step_dir_name(latest)).str();
  }
  std::error_code ec;
  if (fs::exists(fs::path(path) / "manifest.json", ec)) return path;
  for (const fs::path& root : {fs::path(path), fs::path(path) / "checkpoints"}) {
    const int64_t latest = read_latest(root.string());
    if (latest >= 0) return (root / step_dir_name(latest)).string();
  }
  return "";
}

uint64_t remove_uncommitted(const std::string& root, int64_t in_progress) {
  uint64_t freed = 0;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const std::string name = e.path().filename().string();
    const int64_t step = step_of(name);
    int err = 0;
    const Commit state = step >= 0 && step != in_progress ? commit_state(e.path(), &err) : Commit::kCommitted;
    if (state == Commit::kUnknown) {
      log::warn("cannot tell whether {} was committed (manifest.json: {}); left in place", e.path().string(),
                std::strerror(err));
      continue;
    }
    const bool garbage_dir = state == Commit::kUncommitted;
    const bool garbage_file = name.ends_with(".tmp");
    if (!garbage_dir && !garbage_file) continue;
    const uint64_t bytes = garbage_dir ? tree_bytes(e.path()) : e.file_size(ec);
    fs::remove_all(e.path(), ec);
    if (ec) {
      log::warn("cannot remove the uncommitted {}: {}", e.path().string(), ec.message());
      continue;
    }
    log::info("removed {} ({} bytes): a save that never committed", e.path().string(), bytes);
    freed += bytes;
  }
  return freed;
}

namespace {

void remove_checkpoint(const fs::path& dir) {
  std::error_code ec;
  // The manifest goes first, so a half-removed directory is never taken for a checkpoint.
  fs::remove(dir / "manifest.json", ec);
  try {
    sync_parent_dir((dir / "manifest.json").string());
  } catch (const Error& e) {  // a removal that may not be durable yet: the next start sees it again
    log::warn("{}", e.what());
  }
  fs::remove_all(dir, ec);
  if (ec) log::warn("cannot remove the checkpoint {}: {}", dir.string(), ec.message());
}

}  // namespace

void prune(const std::string& root, int keep, int64_t in_use) {
  std::vector<int64_t> steps = committed_steps(root);
  const int64_t latest = read_latest(root);
  for (size_t i = 0; i + static_cast<size_t>(std::max(keep, 1)) < steps.size(); ++i) {
    if (steps[i] != latest && steps[i] != in_use) remove_checkpoint(fs::path(root) / step_dir_name(steps[i]));
  }
}

void remove_newer(const std::string& root, int64_t step) {
  for (const int64_t s : committed_steps(root)) {
    if (s <= step) continue;
    log::warn("removing {}/{}: newer than the checkpoint resumed from", root, step_dir_name(s));
    remove_checkpoint(fs::path(root) / step_dir_name(s));
  }
}

namespace {

// File f of an object-store step: its byte range of the node object the manifest names.
std::unique_ptr<storage::ReadableFile> object_file(const std::string& step_dir, const ManifestFile& f,
                                                   std::string* name) {
  const storage::ObjectUrl dir = storage::parse_s3(step_dir, "checkpoint");
  if (f.object.empty()) throw DataError(fmt::format("{}/manifest.json names no object for {}", step_dir, f.name));
  const storage::ObjectUrl object{dir.bucket, f.object};
  *name = fmt::format("{} (bytes {} to {} of {})", f.name, f.object_offset, f.object_offset + f.bytes, object.str());
  return storage::object_slice(storage::default_s3_client(), object, f.object_offset, f.bytes);
}

}  // namespace

std::unique_ptr<ShardFile> open_shard(const std::string& step_dir, const ManifestFile& f) {
  if (!storage::is_s3(step_dir)) return std::make_unique<ShardFile>(step_dir + "/" + f.name);
  std::string name;
  std::unique_ptr<storage::ReadableFile> file = object_file(step_dir, f, &name);
  return std::make_unique<ShardFile>(name, std::move(file));
}

std::vector<std::string> verify(const std::string& step_dir) {
  std::vector<std::string> problems;
  Manifest m;
  try {
    m = read_manifest(step_dir);
  } catch (const Error& e) {
    return {e.what()};
  }
  for (const ManifestFile& f : m.files) {
    const std::string path = step_dir + "/" + f.name;
    try {
      std::string object_name = path;
      const FileDigest d = storage::is_s3(step_dir) ? digest_file(*object_file(step_dir, f, &object_name), object_name)
                                                    : digest_file(path);
      if (d.bytes != f.bytes) {
        problems.push_back(fmt::format("{}: {} bytes, the manifest records {}", path, d.bytes, f.bytes));
      } else if (d.xxh64 != f.xxh64) {
        problems.push_back(fmt::format("{}: checksum {} differs from the manifest's {}", path, hex64(d.xxh64),
                                       hex64(f.xxh64)));
      }
      // Name the damaged tensors too (the file checksum only says that something is wrong).
      const std::unique_ptr<ShardFile> opened = open_shard(step_dir, f);
      const ShardFile& shard = *opened;
      std::vector<float> buffer;
      for (const ManifestUnit& u : m.units) {
        if (u.pp_rank != f.pp_rank) continue;  // another stage's
        for (const char* kind : Manifest::kKinds) {
          const std::string name = Manifest::tensor_name(u.name, kind);
          const ShardEntry* e = shard.find(name);
          if (e == nullptr || e->bytes != sizeof(float) * static_cast<uint64_t>(parallel::shard_range(u.padded, m.shard_size, f.shard_rank).size)) {
            problems.push_back(fmt::format("{}: tensor {} is {}", path, name, e ? "of the wrong size" : "missing"));
            continue;
          }
          buffer.resize(e->bytes / sizeof(float));
          try {
            shard.read(*e, buffer.data());
          } catch (const Error& err) {
            problems.push_back(err.what());
          }
        }
      }
    } catch (const Error& e) {
      problems.push_back(e.what());
    }
  }
  return problems;
}

CheckpointReader::CheckpointReader(const std::string& step_dir)
    : dir_(step_dir), manifest_(read_manifest(step_dir)), cache_(static_cast<size_t>(manifest_.tensor_parallel)) {}
CheckpointReader::~CheckpointReader() = default;

ShardFile& CheckpointReader::shard(int pp_rank, int tp_rank, int shard_rank) {
  auto& slot = shards_[file_number({pp_rank, tp_rank, shard_rank}, manifest_.tensor_parallel, manifest_.shard_size)];
  if (!slot) {
    const ManifestFile* f = manifest_.file_of(pp_rank, tp_rank, shard_rank);  // parse_manifest checked it exists
    slot = open_shard(dir_, *f);
  }
  return *slot;
}

const ShardEntry& CheckpointReader::slice_entry(int tp_rank, int shard_rank, const ManifestUnit& u, const char* kind) {
  ShardFile& file = shard(u.pp_rank, tp_rank, shard_rank);
  const std::string name = Manifest::tensor_name(u.name, kind);
  const ShardEntry* e = file.find(name);
  if (e == nullptr ||
      e->bytes != sizeof(float) *
                      static_cast<uint64_t>(parallel::shard_range(u.padded, manifest_.shard_size, shard_rank).size)) {
    throw DataError(fmt::format("{}: tensor {} is {}", file.path(), name, e ? "of the wrong size" : "missing"));
  }
  return *e;
}

const std::vector<float>& CheckpointReader::cached_entry(int tp_rank, int shard_rank, int unit, const char* kind) {
  Cached& c = cache_.at(static_cast<size_t>(tp_rank));
  if (c.shard_rank != shard_rank || c.unit != unit || c.kind != kind) {
    const ShardEntry& e = slice_entry(tp_rank, shard_rank, manifest_.units.at(unit), kind);
    c.shard_rank = -1;  // invalid until the read succeeds
    c.data.resize(e.bytes / sizeof(float));
    shard(manifest_.units.at(unit).pp_rank, tp_rank, shard_rank).read(e, c.data.data());
    c.shard_rank = shard_rank;
    c.unit = unit;
    c.kind = kind;
  }
  return c.data;
}

void CheckpointReader::read_slice(int tp_rank, int unit, const char* kind, int64_t begin, int64_t count, float* out) {
  const ManifestUnit& u = manifest_.units.at(unit);
  std::fill(out, out + count, 0.0f);
  const int64_t end = std::min(begin + count, u.numel);
  for (int64_t pos = begin; pos < end;) {
    const int k = parallel::shard_owner(u.padded, manifest_.shard_size, pos);
    const parallel::ShardRange file_range = parallel::shard_range(u.padded, manifest_.shard_size, k);
    const std::vector<float>& slice = cached_entry(tp_rank, k, unit, kind);
    const int64_t stop = std::min(end, file_range.end());
    std::copy(slice.begin() + (pos - file_range.begin), slice.begin() + (stop - file_range.begin), out + (pos - begin));
    pos = stop;
  }
}

int CheckpointReader::unit_index(const std::string& name) const {
  const int i = manifest_.unit_index(name);
  if (i < 0) throw DataError(fmt::format("{}/manifest.json holds no unit {}", dir_, name));
  return i;
}

void CheckpointReader::read_for(const model::UnitLayout& to, int to_tp_rank, int unit, const char* kind, int64_t begin,
                                int64_t count, float* out) {
  const ManifestUnit& saved = manifest_.units.at(unit);
  CHECK(saved.tensors.size() == to.tensors.size());
  std::fill(out, out + count, 0.0f);
  const int64_t end = begin + count;
  for (size_t i = 0; i < to.tensors.size(); ++i) {
    const model::TensorSpec& t = to.tensors[i];
    if (std::max(begin, t.offset) >= std::min(end, t.offset + t.numel())) continue;
    for (const model::Reblock& p : model::reblock(t, to_tp_rank, manifest_.tensor_parallel)) {
      const int64_t lo = std::max(begin, t.offset + p.to), hi = std::min(end, t.offset + p.to + p.count);
      if (lo >= hi) continue;
      read_slice(p.from_rank, unit, kind, saved.tensors[i].offset + p.from + (lo - t.offset - p.to), hi - lo,
                 out + (lo - begin));
    }
  }
}

std::vector<NamedTensor> CheckpointReader::tensors(const char* kind) {
  std::vector<NamedTensor> out;
  std::vector<float> block;
  for (size_t i = 0; i < manifest_.units.size(); ++i) {
    const ManifestUnit& u = manifest_.units[i];
    // Every shard must hold its slice before the manifest's numel sizes anything: a crafted
    // numel then costs at most what the files hold.
    for (int t = 0; t < manifest_.tensor_parallel; ++t) {
      for (int k = 0; k < manifest_.shard_size; ++k) slice_entry(t, k, u, kind);
    }
    for (const ManifestTensor& mt : u.tensors) {
      const model::TensorSpec spec = tensor_spec(mt);
      NamedTensor whole{mt.name, mt.full_shape, std::vector<float>(static_cast<size_t>(spec.full_numel()))};
      block.resize(static_cast<size_t>(spec.numel()));
      for (int t = 0; t < manifest_.tensor_parallel; ++t) {
        read_slice(t, static_cast<int>(i), kind, mt.offset, spec.numel(), block.data());
        model::copy_block_in(spec, t, block.data(), whole.data.data());
      }
      out.push_back(std::move(whole));
    }
  }
  return out;
}

void check_same_model(const Manifest& m, const model::ModelLayout& layout, const std::string& step_dir) {
  auto mismatch = [&](const std::string& what) {
    return DataError(fmt::format("{} was written for another model: {}", step_dir, what));
  };
  const size_t whole_units = static_cast<size_t>(model::ModelLayout(layout.config()).num_units());
  if (m.units.size() != whole_units) {
    throw mismatch(fmt::format("{} units, this model has {}", m.units.size(), whole_units));
  }
  for (const model::UnitLayout& mine : layout.units()) {
    const int index = m.unit_index(mine.name);
    if (index < 0) throw mismatch(fmt::format("no unit {}", mine.name));
    const ManifestUnit* saved = &m.units[static_cast<size_t>(index)];
    if (saved->tensors.size() != mine.tensors.size()) {
      throw mismatch(fmt::format("unit {} has {} tensors, this model's {}", saved->name, saved->tensors.size(),
                                 mine.tensors.size()));
    }
    for (size_t t = 0; t < saved->tensors.size(); ++t) {
      const ManifestTensor& a = saved->tensors[t];
      const model::TensorSpec& b = mine.tensors[t];
      if (a.name != b.name || a.full_shape != b.full_shape || (m.tensor_parallel > 1 && a.split_dim != b.split_dim)) {
        throw mismatch(fmt::format("tensor {} [{}] where this model has {} [{}]", a.name, fmt::join(a.full_shape, ", "),
                                   b.name, fmt::join(b.full_shape, ", ")));
      }
    }
  }
}

ManifestUnit manifest_unit(const model::UnitLayout& u, int pp_rank) {
  ManifestUnit unit{u.name, pp_rank, u.numel, u.padded, {}};
  for (const model::TensorSpec& t : u.tensors) {
    unit.tensors.push_back({t.name, t.shape, t.offset, t.split_dim, t.full_shape});
  }
  return unit;
}

model::TensorSpec tensor_spec(const ManifestTensor& t) {
  model::TensorSpec spec;
  spec.name = t.name;
  spec.shape = t.shape;
  spec.offset = t.offset;
  spec.split_dim = t.split_dim;
  spec.full_shape = t.full_shape;
  return spec;
}

std::string mirror_root(const std::string& mirror_dir, const std::string& root) {
  if (mirror_dir.empty()) return "";
  std::error_code ec;
  fs::path run = fs::weakly_canonical(fs::absolute(root).parent_path(), ec);
  if (ec) run = fs::absolute(root).parent_path();
  const std::string name = run.filename().string();
  if (name.empty() || name == "." || name == "..") {
    throw ConfigError(fmt::format(
        "checkpoint.mirror_dir: the run directory {} has no name to file its mirror under; use a named --run-dir",
        run.string()));
  }
  if (storage::is_s3(mirror_dir)) return storage::parse_s3(mirror_dir, "checkpoint.mirror_dir").child(name).str();
  return (fs::path(mirror_dir) / name).string();
}

void refuse_fresh_run_over_checkpoints(const std::string& run_dir, const std::string& mirror_dir) {
  const std::string root = run_dir + "/checkpoints";
  for (const std::string& dir : {root, mirror_root(mirror_dir, root)}) {
    if (dir.empty()) continue;
    const bool tier = storage::is_s3(dir);
    storage::S3Client* s3 = tier ? &storage::default_s3_client() : nullptr;
    int64_t found = tier ? tier_read_latest(*s3, dir) : read_latest(dir);
    if (const auto steps = tier ? tier_committed_steps(*s3, dir) : committed_steps(dir); found < 0 && !steps.empty()) {
      found = steps.back();
    }
    if (found < 0) continue;
    throw ConfigError(
        fmt::format("{} already holds checkpoints (latest: {}){}; continue it with --resume auto, or "
                    "train in another --run-dir",
                    dir, step_dir_name(found), dir == root ? "" : ", this run's mirror"));
  }
}

}  // namespace tessera::checkpoint
