// A checkpoint shard file: one rank's fp32 tensors (master parameters and AdamW moments of each
// unit's slice) with a checksum per tensor (ARCHITECTURE.md, "Checkpoints").
//
//   offset 0   magic "TSRSHARD" (8 bytes)
//          8   u32 format version (1), u32 zero
//         16   u64 header length H, u64 xxh64 of the header
//         32   header: JSON {"tensors": [{"name", "offset", "bytes", "xxh64"}, ...]}
//   32 + H     zero padding to a multiple of 64: the data region starts there
//              tensor data at "offset" bytes from the data region (64-byte aligned, no overlap)
//
// All integers little-endian; checksums are XXH64 with seed 0 written as 16 hex digits.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/text.h"  // hex64, parse_hex64
#include "storage/readable_file.h"

namespace tessera::checkpoint {

struct TensorView {
  std::string name;
  const float* data = nullptr;
  uint64_t count = 0;  // floats
};

struct ShardEntry {
  std::string name;
  uint64_t offset = 0;  // bytes from the start of the data region
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// Size and XXH64 of a whole file, as the manifest records them.
struct FileDigest {
  uint64_t bytes = 0;
  uint64_t xxh64 = 0;
};

// Writes `tensors` to `path` (created or truncated) and fsyncs it. The file is not renamed: a
// checkpoint directory becomes visible only through its manifest. before_tensor(i), when set, is
// called before tensor i is written and may throw (fault injection). Throws IoError naming the
// file; removes the partial file on failure.
FileDigest write_shard_file(const std::string& path, const std::vector<TensorView>& tensors,
                            const std::function<void(size_t)>& before_tensor = {});

// A shard file opened for reading: the header is parsed and checked against the file's size
// (magic, version, header checksum, every tensor inside the data region, no overlaps), so a
// hostile file costs at most its own size. Throws DataError naming the file when it is damaged or
// missing, IoError when opening or reading it fails (EIO, ESTALE, EACCES: it may be sound).
class ShardFile {
 public:
  explicit ShardFile(const std::string& path);
  // The same read from `file` (an object-store copy), called `name` in messages.
  ShardFile(std::string name, std::unique_ptr<storage::ReadableFile> file);
  ~ShardFile();
  ShardFile(const ShardFile&) = delete;
  ShardFile& operator=(const ShardFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<ShardEntry>& entries() const { return entries_; }
  // The entry called `name`, or null.
  const ShardEntry* find(const std::string& name) const;
  // Reads the entry's bytes / 4 floats into out and checks its checksum; throws DataError naming
  // the file and the tensor on a mismatch, IoError when the read fails.
  void read(const ShardEntry& entry, float* out) const;

 private:
  void parse_header();

  std::string path_;
  std::unique_ptr<storage::ReadableFile> file_;
  uint64_t data_begin_ = 0;
  std::vector<ShardEntry> entries_;
};

// Streams the whole file; throws IoError naming it when it cannot be read.
FileDigest digest_file(const std::string& path);
// The same for a file read at offsets (an object-store copy), `name` in messages.
FileDigest digest_file(const storage::ReadableFile& file, const std::string& name);

}  // namespace tessera::checkpoint
