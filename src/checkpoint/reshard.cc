// Offline resharding.
#include "checkpoint/reshard.h"

#include <fmt/format.h>

#include <filesystem>
#include <vector>

#include "checkpoint/directory.h"
#include "core/error.h"
#include "core/file_io.h"
#include "model/layout.h"
#include "parallel/parallel_dims.h"
#include "parallel/shard_range.h"

namespace tessera::checkpoint {

namespace fs = std::filesystem;

std::string reshard(const std::string& src, const std::string& dst_root, const config::Config& target) {
  CheckpointReader reader(src);
  Manifest m = reader.manifest();
  config::Config stored;
  try {
    stored = config::load_text(m.config_toml, src + "/manifest.json", {});
  } catch (const ConfigError& e) {
    throw DataError(fmt::format("{}/manifest.json: its stored config is invalid: {}", src, e.what()));
  }
  stored.parallel.nproc = target.parallel.nproc;
  stored.parallel.strategy = target.parallel.strategy;
  stored.parallel.shard_group_size = target.parallel.shard_group_size;
  config::validate(stored);  // e.g. the batch must still divide among the new ranks
  const int world = static_cast<int>(target.parallel.nproc);
  const int S = parallel::dims_for(stored, world).dp_shard;
  const model::ModelLayout layout(stored.model, 16 * S);
  if (layout.units().size() != m.units.size()) {
    throw DataError(
        fmt::format("{}: {} units, its stored config describes {}", src, m.units.size(), layout.units().size()));
  }
  const std::string dir = dst_root + "/" + step_dir_name(m.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
  if (fs::exists(dir + "/manifest.json", ec)) throw IoError(fmt::format("{} already holds a checkpoint", dir));
  m.world = world;
  m.shard_size = S;
  m.strategy = config::name(stored.parallel.strategy);
  m.config_toml = config::to_toml(stored);
  m.files.clear();
  for (size_t u = 0; u < m.units.size(); ++u) m.units[u].padded = layout.units()[u].padded;
  for (int k = 0; k < S; ++k) {
    std::vector<std::vector<float>> buffers;
    std::vector<TensorView> views;
    for (size_t u = 0; u < m.units.size(); ++u) {
      const parallel::ShardRange range = parallel::shard_range(m.units[u].padded, S, k);
      for (const char* kind : Manifest::kKinds) {
        buffers.emplace_back(range.size);
        reader.read_slice(static_cast<int>(u), kind, range.begin, range.size, buffers.back().data());
        views.push_back(
            {Manifest::tensor_name(m.units[u].name, kind), buffers.back().data(), static_cast<uint64_t>(range.size)});
      }
    }
    const std::string name = shard_file_name(k);
    const FileDigest d = write_shard_file(dir + "/" + name, views);
    m.files.push_back({name, k, d.bytes, d.xxh64});
  }
  write_file_atomic(dir + "/manifest.json", to_json(m));
  write_latest(dst_root, m.step);
  return dir;
}

}  // namespace tessera::checkpoint
