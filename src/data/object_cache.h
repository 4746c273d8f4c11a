// Dataset shards on an object store, fetched into a local cache: each object with large ranged
// GETs (S3Options::part_bytes each, a few at a time) under a lock file, so the ranks of a node
// fetch it once and a later epoch or run reads the cached copy. Never one GET per sample.
#pragma once

#include <cstdint>
#include <string>

#include "storage/object_url.h"

namespace tessera::storage {
class S3Client;
}

namespace tessera::data {

struct FetchStats {
  int64_t gets = 0;    // ranged GETs sent (0: the copy was cached)
  uint64_t bytes = 0;  // fetched
  double seconds = 0;
};

// Where object `url` is cached under cache_dir: CACHE_DIR/s3/BUCKET/KEY.
std::string cache_path(const std::string& cache_dir, const storage::ObjectUrl& url);

// Makes `path` hold the `bytes` bytes of object `url` (or leaves a copy of that size already
// there), written under a temporary name and renamed into place. Throws S3Error or IoError.
FetchStats fetch_to_cache(storage::S3Client& s3, const storage::ObjectUrl& url, uint64_t bytes,
                          const std::string& path);

// Uploads the prepared dataset directory `dir` to `url` (s3://BUCKET/PREFIX): the tokenizer and
// every shard the manifest lists, then manifest.json last, so a manifest in the bucket always
// means a complete dataset. Returns the PUT requests sent.
int64_t upload_dataset(storage::S3Client& s3, const std::string& dir, const storage::ObjectUrl& url);

}  // namespace tessera::data
