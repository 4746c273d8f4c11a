// Layer storage: where durable bytes live besides local and shared file systems. An object
// store (S3 and S3-compatible servers) addressed as s3://BUCKET/PREFIX, its client, and the
// readable-file view the checkpoint and data layers read through. It knows only core.
//
// Locations: a setting that names a directory (checkpoint.mirror_dir, data.dataset, a command's
// path) is either a local path or s3://BUCKET[/PREFIX]. Any other scheme is refused: a value like
// "gs://b/x" must never be taken for a local directory named "gs:".
#pragma once

#include <string>

namespace tessera::storage {

// An object key under a bucket. `key` has no leading or trailing '/'; "" is the bucket's root.
struct ObjectUrl {
  std::string bucket;
  std::string key;

  std::string str() const;                         // "s3://bucket/key"
  ObjectUrl child(const std::string& name) const;  // key + "/" + name
  std::string name() const;                        // the key's last component
};

// True for "s3://...".
bool is_s3(const std::string& location);
// Parses s3://BUCKET[/PREFIX]; throws ConfigError naming `what` (a config key or an argument)
// when the bucket name is not a valid S3 bucket name or the prefix holds empty components.
ObjectUrl parse_s3(const std::string& location, const std::string& what);
// Throws ConfigError naming `what` unless `location` is a local path or a valid s3:// URL.
void check_location(const std::string& location, const std::string& what);

}  // namespace tessera::storage
