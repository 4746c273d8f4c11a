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

namespace {

// The manifest of committed step `step` under root, each file placed in its node's object (the
// node's files in manifest order, back to back); the files of each node, by manifest index.
Manifest placed_manifest(const std::string& root, int64_t step, const std::string& mirror, const TierUpload& how,
                         std::map<int, std::vector<size_t>>* files_of_node) {
  Manifest m = read_manifest(root + "/" + step_dir_name(step));
  std::map<int, uint64_t> offset;
  for (size_t i = 0; i < m.files.size(); ++i) {
    ManifestFile& f = m.files[i];
    const auto number =
        static_cast<size_t>(file_number({f.pp_rank, f.tp_rank, f.shard_rank}, m.tensor_parallel, m.shard_size));
    const int node = number < how.node_of_file.size() ? how.node_of_file[number] : 0;
    (*files_of_node)[node].push_back(i);
    f.object = tier_object_key(mirror, step, node, how.prefixes);
    f.object_offset = offset[node];
    offset[node] += f.bytes;
  }
  return m;
}

}  // namespace

TierUploadStats upload_node_object(storage::S3Client& s3, const std::string& root, int64_t step,
                                   const std::string& mirror, const TierUpload& how, int node) {
  const int64_t puts_before = s3.counts().puts();
  std::map<int, std::vector<size_t>> files_of_node;
  const Manifest m = placed_manifest(root, step, mirror, how, &files_of_node);
  TierUploadStats stats;
  if (files_of_node.count(node) == 0) return stats;  // a node whose ranks hold no first replica
  const std::string dir = root + "/" + step_dir_name(step);
  const storage::ObjectUrl object{url_of(mirror).bucket, tier_object_key(mirror, step, node, how.prefixes)};
  std::vector<storage::FileSlice> slices;
  for (size_t i : files_of_node[node]) {
    slices.push_back({dir + "/" + m.files[i].name, 0, m.files[i].bytes});
    stats.bytes += m.files[i].bytes;
  }
  s3.upload(object, slices);
  const std::optional<uint64_t> stored = s3.head(object);
  if (stored != stats.bytes) {
    throw IoError(fmt::format("{} holds {} bytes after its upload, {} were sent", object.str(),
                              stored ? std::to_string(*stored) : "no", stats.bytes));
  }
  stats.objects = 1;
  stats.puts = s3.counts().puts() - puts_before;
  return stats;
}

void commit_upload(storage::S3Client& s3, const std::string& root, int64_t step, const std::string& mirror,
                   const TierUpload& how) {
  std::map<int, std::vector<size_t>> files_of_node;
  const Manifest m = placed_manifest(root, step, mirror, how, &files_of_node);
  const storage::ObjectUrl base = url_of(mirror);
  s3.put(base.child(step_dir_name(step) + "/manifest.json"), to_json(m));  // the commit
  s3.put(base.child("latest"), std::to_string(step) + "\n");
  tier_prune(s3, mirror, how.keep);
}

void drop_upload(storage::S3Client& s3, int64_t step, const std::string& mirror, const TierUpload& how, int nodes) {
  const std::string bucket = url_of(mirror).bucket;
  for (int node = 0; node < nodes; ++node) {
    try {
      s3.remove({bucket, tier_object_key(mirror, step, node, how.prefixes)});
    } catch (const Error& e) {
      log::warn("cannot remove the uncommitted upload of step {}: {}", step, e.what());
    }
  }
}

TierUploadStats upload_checkpoint(storage::S3Client& s3, const std::string& root, int64_t step,
                                  const std::string& mirror, const TierUpload& how) {
  const int64_t puts_before = s3.counts().puts();
  std::map<int, std::vector<size_t>> files_of_node;
  placed_manifest(root, step, mirror, how, &files_of_node);
  TierUploadStats stats;
  for (const auto& [node, files] : files_of_node) {
    const TierUploadStats sent = upload_node_object(s3, root, step, mirror, how, node);
    stats.objects += sent.objects;
    stats.bytes += sent.bytes;
  }
  commit_upload(s3, root, step, mirror, how);
  stats.puts = s3.counts().puts() - puts_before;
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
