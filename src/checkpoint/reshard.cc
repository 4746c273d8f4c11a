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
  stored.parallel.tensor = target.parallel.tensor;
  stored.parallel.strategy = target.parallel.strategy;
  stored.parallel.shard_group_size = target.parallel.shard_group_size;
  config::validate(stored);  // e.g. the batch must still divide among the new ranks
  const int world = static_cast<int>(target.parallel.nproc);
  const parallel::ParallelDims dims = parallel::dims_for(stored, world);
  const int S = dims.dp_shard, T = dims.tp;
  check_same_model(m, model::ModelLayout(stored.model, 16 * S, {T, 0}), src);
  const std::string dir = dst_root + "/" + step_dir_name(m.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
  if (fs::exists(dir + "/manifest.json", ec)) throw IoError(fmt::format("{} already holds a checkpoint", dir));
  Manifest out = m;
  out.world = world;
  out.shard_size = S;
  out.tensor_parallel = T;
  out.strategy = config::name(stored.parallel.strategy);
  out.config_toml = config::to_toml(stored);
  out.files.clear();
  out.units.clear();
  // One file per (tp, dp_shard) coordinate: tp rank t's blocks, re-cut from the saved ones.
  for (int t = 0; t < T; ++t) {
    const model::ModelLayout layout(stored.model, 16 * S, {T, t});
    if (t == 0) {
      for (const model::UnitLayout& u : layout.units()) {
        ManifestUnit unit{u.name, u.numel, u.padded, {}};
        for (const model::TensorSpec& x : u.tensors) {
          unit.tensors.push_back({x.name, x.shape, x.offset, x.split_dim, x.full_shape});
        }
        out.units.push_back(std::move(unit));
      }
    }
    for (int k = 0; k < S; ++k) {
      std::vector<std::vector<float>> buffers;
      std::vector<TensorView> views;
      for (int u = 0; u < layout.num_units(); ++u) {
        const parallel::ShardRange range = parallel::shard_range(layout.units()[u].padded, S, k);
        for (const char* kind : Manifest::kKinds) {
          buffers.emplace_back(range.size);
          reader.read_for(layout.units()[u], t, u, kind, range.begin, range.size, buffers.back().data());
          views.push_back({Manifest::tensor_name(layout.units()[u].name, kind), buffers.back().data(),
                           static_cast<uint64_t>(range.size)});
        }
      }
      const std::string name = shard_file_name(k, t, T);
      const FileDigest d = write_shard_file(dir + "/" + name, views);
      out.files.push_back({name, t, k, d.bytes, d.xxh64});
    }
  }
  m = std::move(out);
  write_file_atomic(dir + "/manifest.json", to_json(m));
  write_latest(dst_root, m.step);
  return dir;
}

}  // namespace tessera::checkpoint
