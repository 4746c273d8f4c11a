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
  stored.parallel.pipeline = target.parallel.pipeline;
  stored.parallel.pipeline_layers = target.parallel.pipeline_layers;
  stored.parallel.strategy = target.parallel.strategy;
  stored.parallel.shard_group_size = target.parallel.shard_group_size;
  config::validate(stored);  // e.g. the batch must still divide among the new ranks
  const int world = static_cast<int>(target.parallel.nproc);
  const parallel::ParallelDims dims = parallel::dims_for(stored, world);
  const int S = dims.dp_shard, T = dims.tp, P = dims.pp;
  const std::string dir = dst_root + "/" + step_dir_name(m.step);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", dir, ec.message()));
  if (fs::exists(dir + "/manifest.json", ec)) throw IoError(fmt::format("{} already holds a checkpoint", dir));
  Manifest out = m;
  out.world = world;
  out.shard_size = S;
  out.tensor_parallel = T;
  out.pipeline_parallel = P;
  out.strategy = config::name(stored.parallel.strategy);
  out.config_toml = config::to_toml(stored);
  out.files.clear();
  out.units.clear();
  // One file per (pp, tp, dp_shard) coordinate: stage p's units, tp rank t's blocks of them,
  // re-cut from the saved ones.
  for (int p = 0; p < P; ++p) {
    for (int t = 0; t < T; ++t) {
      const model::ModelLayout layout(stored.model, 16 * S, {T, t},
                                      model::pipeline_stage(stored.model, P, p, stored.parallel.pipeline_layers));
      check_same_model(m, layout, src);
      if (t == 0) {
        for (const model::UnitLayout& u : layout.units()) out.units.push_back(manifest_unit(u, p));
      }
      for (int k = 0; k < S; ++k) {
        std::vector<std::vector<float>> buffers;
        std::vector<TensorView> views;
        for (const model::UnitLayout& u : layout.units()) {
          const parallel::ShardRange range = parallel::shard_range(u.padded, S, k);
          for (const char* kind : Manifest::kKinds) {
            buffers.emplace_back(range.size);
            reader.read_for(u, t, reader.unit_index(u.name), kind, range.begin, range.size, buffers.back().data());
            views.push_back(
                {Manifest::tensor_name(u.name, kind), buffers.back().data(), static_cast<uint64_t>(range.size)});
          }
        }
        const std::string name = shard_file_name(k, t, T, p, P);
        const FileDigest d = write_shard_file(dir + "/" + name, views);
        out.files.push_back({name, p, t, k, d.bytes, d.xxh64});
      }
    }
  }
  m = std::move(out);
  write_file_atomic(dir + "/manifest.json", to_json(m));
  write_latest(dst_root, m.step);
  return dir;
}

}  // namespace tessera::checkpoint
