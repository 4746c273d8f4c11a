// The object-store tier: checkpoint.mirror_dir = "s3://BUCKET/PREFIX" (ARCHITECTURE.md,
// "Checkpoints", tiered). After each local commit the checkpoint is uploaded under
// MIRROR = s3://BUCKET/PREFIX/RUN (mirror_root()):
//
//   PREFIX[/HH]/RUN/step_N/node_KKKKK.bin   node K's shard files, concatenated: one object per
//                                           node (multipart, parallel parts), so an 8-rank node
//                                           costs the PUTs of one upload, not eight
//   MIRROR/step_N/manifest.json             the local manifest plus each file's object and
//                                           offset; uploaded after every object: the commit
//   MIRROR/latest                           the newest committed step, replaced after the manifest
//
// HH: two hex digits of a hash of the object's name, over checkpoint.s3_prefixes prefixes (none
// when 1), since S3 limits each prefix to about 3,500 writes and 5,500 reads per second. A
// manifest in the bucket always means a complete checkpoint; a resume reads only the byte
// ranges of its rank's slice (ranged GETs of the objects, every tensor checked against its
// checksum).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/manifest.h"

namespace tessera::storage {
class S3Client;
}

namespace tessera::checkpoint {

struct TierUpload {
  int keep = 3;                   // committed checkpoints kept in the bucket (checkpoint.keep)
  int prefixes = 1;               // checkpoint.s3_prefixes
  std::vector<int> node_of_file;  // by file number (manifest order): the node whose ranks wrote it
};

// What one upload sent.
struct TierUploadStats {
  int objects = 0;     // node objects
  uint64_t bytes = 0;  // of the node objects
  int64_t puts = 0;    // PUT requests (objects and parts; the manifest and `latest` included)
};

// The steps of an upload, for uploaders on several nodes (Checkpointer): each node's uploader
// sends its object; once all have, one commits (the manifest, then `latest`, then the prune); a
// failed upload's objects are dropped. Each throws S3Error or IoError naming the object.
TierUploadStats upload_node_object(storage::S3Client& s3, const std::string& root, int64_t step,
                                   const std::string& mirror, const TierUpload& how, int node);
void commit_upload(storage::S3Client& s3, const std::string& root, int64_t step, const std::string& mirror,
                   const TierUpload& how);
void drop_upload(storage::S3Client& s3, int64_t step, const std::string& mirror, const TierUpload& how, int nodes);

// All of it from one process: uploads the committed checkpoint ROOT/step_N to the tier at
// `mirror` (an s3:// URL), every node's object, then commits. What a failed upload sent is not
// visible as a checkpoint (no manifest).
TierUploadStats upload_checkpoint(storage::S3Client& s3, const std::string& root, int64_t step,
                                  const std::string& mirror, const TierUpload& how);

// The tier's committed steps (those with a manifest), ascending, and the step `latest` names (-1
// when there is none).
std::vector<int64_t> tier_committed_steps(storage::S3Client& s3, const std::string& mirror);
int64_t tier_read_latest(storage::S3Client& s3, const std::string& mirror);
// Removes the oldest committed checkpoints so that `keep` remain, never the one `latest` names:
// each manifest first (uncommitted from then on), then its objects.
void tier_prune(storage::S3Client& s3, const std::string& mirror, int keep);

// The key of node `node`'s object of step `step`.
std::string tier_object_key(const std::string& mirror, int64_t step, int node, int prefixes);

}  // namespace tessera::checkpoint
