#include "checkpoint/object_tier.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <map>
#include <set>

#include "checkpoint/directory.h"
#include "core/error.h"
#include "core/log.h"
#include "storage/s3_client.h"

namespace tessera::checkpoint {
namespace {

storage::ObjectUrl url_of(const std::string& mirror) { return storage::parse_s3(mirror, "checkpoint.mirror_dir"); }

}  // namespace

std::string tier_object_key(const std::string& mirror, int64_t step, int node, int prefixes) {
  const storage::ObjectUrl m = url_of(mirror);
  const size_t slash = m.key.rfind('/');
  const std::string base = slash == std::string::npos ? "" : m.key.substr(0, slash + 1);  // "PREFIX/"
  const std::string run = slash == std::string::npos ? m.key : m.key.substr(slash + 1);
  const std::string name = fmt::format("{}/{}/node_{:05d}.bin", run, step_dir_name(step), node);
  if (prefixes <= 1) return base + name;
  const uint64_t h = XXH64(name.data(), name.size(), 0) % static_cast<uint64_t>(prefixes);
  return fmt::format("{}{:02x}/{}", base, h, name);
}

TierUploadStats upload_checkpoint(storage::S3Client& s3, const std::string& root, int64_t step,
                                  const std::string& mirror, const TierUpload& how) {
  TierUploadStats stats;
  const int64_t puts_before = s3.counts().puts();
  const std::string dir = root + "/" + step_dir_name(step);
  Manifest m = read_manifest(dir);
  const storage::ObjectUrl base = url_of(mirror);
  std::map<int, std::vector<size_t>> files_of_node;  // node -> manifest file indices, in order
  for (size_t i = 0; i < m.files.size(); ++i) {
    const int number =
        file_number({m.files[i].pp_rank, m.files[i].tp_rank, m.files[i].shard_rank}, m.tensor_parallel, m.shard_size);
    const int node = static_cast<size_t>(number) < how.node_of_file.size() ? how.node_of_file[number] : 0;
    files_of_node[node].push_back(i);
  }
  for (const auto& [node, files] : files_of_node) {
    const storage::ObjectUrl object{base.bucket, tier_object_key(mirror, step, node, how.prefixes)};
    std::vector<storage::FileSlice> slices;
    uint64_t offset = 0;
    for (size_t i : files) {
      ManifestFile& f = m.files[i];
      slices.push_back({dir + "/" + f.name, 0, f.bytes});
      f.object = object.key;
      f.object_offset = offset;
      offset += f.bytes;
    }
    s3.upload(object, slices);
    ++stats.objects;
    stats.bytes += offset;
    const std::optional<uint64_t> stored = s3.head(object);
    if (stored != offset) {
      throw IoError(fmt::format("{} holds {} bytes after its upload, {} were sent", object.str(),
                                stored ? std::to_string(*stored) : "no", offset));
    }
  }
  s3.put(base.child(step_dir_name(step) + "/manifest.json"), to_json(m));  // the commit
  s3.put(base.child("latest"), std::to_string(step) + "\n");
  stats.puts = s3.counts().puts() - puts_before;
  tier_prune(s3, mirror, how.keep);
  return stats;
}

std::vector<int64_t> tier_committed_steps(storage::S3Client& s3, const std::string& mirror) {
  const storage::ObjectUrl base = url_of(mirror);
  std::vector<int64_t> steps;
  const std::string suffix = "/manifest.json";
  for (const storage::ObjectInfo& o : s3.list(base.child("step_"))) {
    if (o.key.size() <= suffix.size() || o.key.compare(o.key.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const std::string name = o.key.substr(base.key.size() + 1, o.key.size() - base.key.size() - 1 - suffix.size());
    if (name.size() != 13 || name.find_first_not_of("0123456789", 5) != std::string::npos) continue;
    steps.push_back(std::stoll(name.substr(5)));
  }
  std::sort(steps.begin(), steps.end());
  return steps;
}

int64_t tier_read_latest(storage::S3Client& s3, const std::string& mirror) {
  const storage::ObjectUrl latest = url_of(mirror).child("latest");
  std::string text;
  try {
    text = s3.get(latest, 64);
  } catch (const storage::S3Error& e) {
    if (e.status() == 404 && e.code() == "NoSuchKey") return -1;
    throw;
  }
  char* end = nullptr;
  const long long step = std::strtoll(text.c_str(), &end, 10);
  if (end == text.c_str() || step < 0) throw DataError(fmt::format("{} holds \"{}\", not a step", latest.str(), text));
  return step;
}

void tier_prune(storage::S3Client& s3, const std::string& mirror, int keep) {
  const std::vector<int64_t> steps = tier_committed_steps(s3, mirror);
  const int64_t latest = tier_read_latest(s3, mirror);
  const storage::ObjectUrl base = url_of(mirror);
  const int excess = static_cast<int>(steps.size()) - keep;
  for (int i = 0; i < excess; ++i) {
    if (steps[static_cast<size_t>(i)] == latest) continue;
    const std::string step_dir = base.child(step_dir_name(steps[static_cast<size_t>(i)])).str();
    const Manifest m = parse_manifest(s3.get(storage::parse_s3(step_dir + "/manifest.json", "checkpoint")), step_dir);
    s3.remove(storage::parse_s3(step_dir + "/manifest.json", "checkpoint"));  // uncommitted from here on
    std::set<std::string> objects;
    for (const ManifestFile& f : m.files) objects.insert(f.object);
    for (const std::string& key : objects) {
      if (!key.empty()) s3.remove({base.bucket, key});
    }
    log::info("pruned {} from the object-store tier", step_dir);
  }
}

}  // namespace tessera::checkpoint
