// A file read at offsets, wherever it lives: a local file (pread) or a byte range of an object
// (ranged GETs). Checkpoint shards and dataset shards are read through it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "storage/object_url.h"

namespace tessera::storage {

class S3Client;

class ReadableFile {
 public:
  virtual ~ReadableFile() = default;
  virtual uint64_t size() const = 0;
  // Exactly n bytes at offset into out; false when the file ends first. Throws IoError when the
  // read fails (the file may well be sound).
  virtual bool read_at(uint64_t offset, uint64_t n, void* out) const = 0;
};

// Bytes [offset, offset + size) of object `url` as a file; nothing is fetched until read.
std::unique_ptr<ReadableFile> object_slice(S3Client& client, ObjectUrl url, uint64_t offset, uint64_t size);

}  // namespace tessera::storage
