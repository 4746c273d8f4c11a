// manifest.json: writer and checked parser.
#include "checkpoint/manifest.h"

#include <fmt/format.h>

#include <cerrno>

#include "checkpoint/shard_file.h"
#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "core/json_keys.h"
#include "storage/s3_client.h"

namespace tessera::checkpoint {
namespace {

using nlohmann::json;

constexpr uint64_t kMaxManifestBytes = 256ull << 20;

// A tensor's split among the tensor-parallel ranks: its whole shape is its block's with the split
// dimension T times as long (version 1: replicated, the block is the whole).
void parse_split(const JsonKeys& c, bool v1, int T, ManifestTensor* t) {
  t->full_shape = t->shape;
  if (v1) return;
  t->split_dim = static_cast<int>(c.integer("split_dim", -1, static_cast<int64_t>(t->shape.size()) - 1));
  if (t->split_dim >= 0) {
    int64_t& d = t->full_shape[static_cast<size_t>(t->split_dim)];
    if (d > INT64_MAX / 8 / T) throw c.error("shape", "is too large to be cut among the tp ranks");
    d *= T;
  }
  std::vector<int64_t> full;
  for (const json& d : c.array("full_shape")) {
    if (!d.is_number_integer()) throw c.error("full_shape", "has a dimension that is not an integer");
    full.push_back(d.get<int64_t>());
  }
  if (full != t->full_shape) {
    throw c.error("full_shape",
                  fmt::format("is not the block's shape with dimension {} cut among {} tp ranks", t->split_dim, T));
  }
}

}  // namespace

int file_number(const FileCoord& c, int tensor_parallel, int shard_size) {
  return (c.pp_rank * tensor_parallel + c.tp_rank) * shard_size + c.shard_rank;
}

FileCoord file_coord(int number, int tensor_parallel, int shard_size) {
  return {number / shard_size / tensor_parallel, number / shard_size % tensor_parallel, number % shard_size};
}

int Manifest::unit_index(const std::string& name) const {
  for (size_t i = 0; i < units.size(); ++i) {
    if (units[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

const ManifestFile* Manifest::file_of(int pp_rank, int tp_rank, int shard_rank) const {
  for (const auto& f : files) {
    if (f.pp_rank == pp_rank && f.tp_rank == tp_rank && f.shard_rank == shard_rank) return &f;
  }
  return nullptr;
}

std::string to_json(const Manifest& m) {
  nlohmann::ordered_json units = nlohmann::ordered_json::array(), files = nlohmann::ordered_json::array();
  for (const auto& u : m.units) {
    nlohmann::ordered_json tensors = nlohmann::ordered_json::array();
    for (const auto& t : u.tensors) {
      tensors.push_back({{"name", t.name},
                         {"shape", t.shape},
                         {"offset", t.offset},
                         {"split_dim", t.split_dim},
                         {"full_shape", t.full_shape}});
    }
    units.push_back(
        {{"name", u.name}, {"pp_rank", u.pp_rank}, {"numel", u.numel}, {"padded", u.padded}, {"tensors", tensors}});
  }
  for (const auto& f : m.files) {
    nlohmann::ordered_json file = {{"name", f.name},       {"pp_rank", f.pp_rank},
                                   {"tp_rank", f.tp_rank}, {"shard_rank", f.shard_rank},
                                   {"bytes", f.bytes},     {"xxh64", hex64(f.xxh64)}};
    if (!f.object.empty()) {
      file["object"] = f.object;
      file["object_offset"] = f.object_offset;
    }
    files.push_back(std::move(file));
  }
  const nlohmann::ordered_json j = {
      {"format", "tessera-checkpoint"},
      {"version", Manifest::kVersion},
      {"step", m.step},
      {"optimizer_steps", m.optimizer_steps},
      {"tokens", m.tokens},
      {"sampler_position", m.sampler_position},
      {"seed", m.seed},
      {"schedule",
       {{"lr", m.lr},
        {"min_lr", m.min_lr},
        {"warmup_steps", m.warmup_steps},
        {"total_steps", m.total_steps},
        {"decay", m.decay},
        {"decay_steps", m.decay_steps}}},
      {"world", m.world},
      {"shard_size", m.shard_size},
      {"tensor_parallel", m.tensor_parallel},
      {"pipeline_parallel", m.pipeline_parallel},
      {"strategy", m.strategy},
      {"created", m.created},
      {"files", files},
      {"units", units},
      {"config", m.config_toml},
  };
  return dump_json(j, 1);  // no trailing newline: cutting any byte off damages it
}

namespace {

// The shard files: one for each (stage, tp rank, shard rank) of the layout already read into m.
void parse_files(const JsonKeys& top, bool v1, Manifest* m) {
  const int T = m->tensor_parallel, P = m->pipeline_parallel;
  std::vector<bool> seen(static_cast<size_t>(P * T * m->shard_size), false);
  for (size_t i = 0; i < top.array("files").size(); ++i) {
    const JsonKeys f = top.element("files", i);
    ManifestFile file;
    file.name = f.string("name");
    if (file.name.empty() || file.name.find('/') != std::string::npos || file.name[0] == '.') {
      throw f.error("name", fmt::format("= \"{}\" is not a file name in the checkpoint directory", file.name));
    }
    file.pp_rank = v1 ? 0 : static_cast<int>(f.integer("pp_rank", 0, P - 1));
    file.tp_rank = v1 ? 0 : static_cast<int>(f.integer("tp_rank", 0, T - 1));
    file.shard_rank = static_cast<int>(f.integer("shard_rank", 0, m->shard_size - 1));
    const auto index =
        static_cast<size_t>(file_number({file.pp_rank, file.tp_rank, file.shard_rank}, T, m->shard_size));
    if (seen[index]) {
      throw f.error("shard_rank", fmt::format("{} of tp rank {} of stage {} appears twice", file.shard_rank,
                                              file.tp_rank, file.pp_rank));
    }
    seen[index] = true;
    file.bytes = f.unsigned_integer("bytes");
    file.xxh64 = f.hex64("xxh64");
    if (f.contains("object")) {
      file.object = f.string("object");
      file.object_offset = f.unsigned_integer("object_offset");
    }
    m->files.push_back(std::move(file));
  }
  for (size_t i = 0; i < seen.size(); ++i) {
    if (!seen[i]) {
      const FileCoord c = file_coord(static_cast<int>(i), T, m->shard_size);
      throw top.error("files", fmt::format("has no file for shard rank {}{}{}", c.shard_rank,
                                           T > 1 ? fmt::format(" of tp rank {}", c.tp_rank) : "",
                                           P > 1 ? fmt::format(" of stage {}", c.pp_rank) : ""));
    }
  }
}

// A tensor of a unit of unit_numel elements: its shape and offset inside the unit, its tp split.
ManifestTensor parse_tensor(const JsonKeys& c, int64_t unit_numel, bool v1, int T) {
  ManifestTensor tensor;
  tensor.name = c.string("name");
  int64_t n = 1;
  for (const json& d : c.array("shape")) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0 || d.get<int64_t>() > unit_numel) {
      throw c.error("shape", "has a dimension that is negative or larger than the unit");
    }
    tensor.shape.push_back(d.get<int64_t>());
    n = tensor.shape.back() == 0 ? 0 : n <= unit_numel / tensor.shape.back() ? n * tensor.shape.back() : -1;
    if (n < 0) throw c.error("shape", "holds more elements than the unit");
  }
  tensor.offset = c.integer("offset", 0, unit_numel);
  if (n > unit_numel - tensor.offset) throw c.error("offset", "puts the tensor beyond the end of its unit");
  parse_split(c, v1, T, &tensor);
  return tensor;
}

// The units, each padded to a multiple of the shard size, their names unique.
void parse_units(const JsonKeys& top, bool v1, Manifest* m) {
  for (size_t i = 0; i < top.array("units").size(); ++i) {
    const JsonKeys u = top.element("units", i);
    ManifestUnit unit;
    unit.name = u.string("name");
    unit.pp_rank = v1 ? 0 : static_cast<int>(u.integer("pp_rank", 0, m->pipeline_parallel - 1));
    if (m->unit_index(unit.name) >= 0) throw u.error("name", fmt::format("\"{}\" appears twice", unit.name));
    unit.numel = u.integer("numel", 0, INT64_MAX / 8);
    unit.padded = u.integer("padded", unit.numel, INT64_MAX / 8);
    if (unit.padded % m->shard_size != 0) {
      throw u.error("padded", fmt::format("is not a multiple of {}", m->shard_size));
    }
    for (size_t t = 0; t < u.array("tensors").size(); ++t) {
      unit.tensors.push_back(parse_tensor(u.element("tensors", t), unit.numel, v1, m->tensor_parallel));
    }
    m->units.push_back(std::move(unit));
  }
}

}  // namespace

Manifest parse_manifest(const std::string& text, const std::string& origin) {
  const json j = parse_json(text);
  if (j.is_discarded() || !j.is_object()) throw DataError(fmt::format("{}: not a JSON object", origin));
  const JsonKeys top(j, origin);
  if (top.string("format") != "tessera-checkpoint") throw top.error("format", "is not tessera-checkpoint");
  const int64_t version = top.integer("version", 1, 1 << 20);
  if (version > Manifest::kVersion) {
    throw top.error("version", fmt::format("= {}; this build reads versions 1 to {}", version, Manifest::kVersion));
  }
  const bool v1 = version == 1;  // no tensor parallelism
  Manifest m;
  m.step = top.integer("step", 0, INT64_MAX);
  // Absent from manifests written before skipped steps stopped counting (their updates used
  // `step`, so resuming with it continues them as they were).
  m.optimizer_steps = top.contains("optimizer_steps") ? top.integer("optimizer_steps", 0, m.step) : m.step;
  m.tokens = top.integer("tokens", 0, INT64_MAX);
  m.sampler_position = top.unsigned_integer("sampler_position");
  m.seed = top.unsigned_integer("seed");
  const JsonKeys schedule = top.object("schedule");
  m.lr = schedule.number("lr");
  m.min_lr = schedule.number("min_lr");
  m.warmup_steps = schedule.integer("warmup_steps", 0, INT64_MAX);
  m.total_steps = schedule.integer("total_steps", 0, INT64_MAX);
  // Absent before train.lr_decay: warmup then cosine over every later step.
  if (schedule.contains("decay")) m.decay = schedule.string("decay");
  if (schedule.contains("decay_steps")) m.decay_steps = schedule.integer("decay_steps", 0, INT64_MAX);
  m.world = static_cast<int>(top.integer("world", 1, 1 << 20));
  m.shard_size = static_cast<int>(top.integer("shard_size", 1, m.world));
  if (m.world % m.shard_size != 0) throw top.error("shard_size", fmt::format("does not divide world {}", m.world));
  m.tensor_parallel = v1 ? 1 : static_cast<int>(top.integer("tensor_parallel", 1, m.world / m.shard_size));
  if (m.world % (m.shard_size * m.tensor_parallel) != 0) {
    throw top.error("tensor_parallel", fmt::format("x shard_size does not divide world {}", m.world));
  }
  m.pipeline_parallel =
      v1 ? 1 : static_cast<int>(top.integer("pipeline_parallel", 1, m.world / (m.shard_size * m.tensor_parallel)));
  if (m.world % (m.shard_size * m.tensor_parallel * m.pipeline_parallel) != 0) {
    throw top.error("pipeline_parallel",
                    fmt::format("x tensor_parallel x shard_size does not divide world {}", m.world));
  }
  m.strategy = top.string("strategy");
  m.created = top.string("created");
  m.config_toml = top.string("config");
  parse_files(top, v1, &m);
  parse_units(top, v1, &m);
  return m;
}

Manifest read_manifest(const std::string& step_dir) {
  const std::string path = step_dir + "/manifest.json";
  if (storage::is_s3(step_dir)) {
    const storage::ObjectUrl url = storage::parse_s3(path, "checkpoint");
    std::string text;
    try {
      text = storage::default_s3_client().get(url, kMaxManifestBytes);
    } catch (const storage::S3Error& e) {
      if (e.status() == 404 && e.code() == "NoSuchKey") throw DataError(fmt::format("{} is missing", path));
      throw;
    }
    return parse_manifest(text, path);
  }
  const FileBytes file = try_read_file(path, kMaxManifestBytes);
  if (file.error == ENOENT) throw DataError(fmt::format("{} is missing", path));
  if (file.error == EFBIG)
    throw DataError(fmt::format("{}: more than {} bytes is too large for a manifest", path, kMaxManifestBytes));
  if (!file) throw IoError(fmt::format("cannot read {}: {}", path, file.reason()));  // may be sound
  return parse_manifest(file.bytes, path);
}

}  // namespace tessera::checkpoint
