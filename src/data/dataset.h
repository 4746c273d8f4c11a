// Layer data: text, tokenizers, token shards, prepared datasets, the sampler and the loader. It
// must not know models, parameters or processes (a loader is given its rank's slice).
//
// A prepared dataset: the directory `tessera prepare` writes, with manifest.json listing the
// shards of each split, and the token stream of one split read through its shards.
//
// manifest.json: {"format": "tessera-dataset", "version": 1,
//   "tokenizer": {"file": "tokenizer.model", "hash": "<16 hex digits>", "vocab_size": V,
//                 "eos_id": E},
//   "splits": {"train": {"tokens": N, "documents": D, "shards": [{"file": "train-00000.bin",
//              "tokens": n, "documents": d, "checksum": "<16 hex digits>"}, ...]},
//              "val": {...}},
//   "inputs": [...], "unigram_entropy_nats": H}   (H over the train split's tokens)
// The tokenizer model is copied into the directory, so a dataset is self-contained.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "data/shard.h"

namespace tessera::data {

struct ShardEntry {
  std::string file;  // relative to the dataset directory
  uint64_t tokens = 0;
  uint64_t documents = 0;
  uint64_t checksum = 0;
};

struct SplitManifest {
  uint64_t tokens = 0;
  uint64_t documents = 0;
  std::vector<ShardEntry> shards;
};

struct DatasetManifest {
  std::string tokenizer_file;
  uint64_t tokenizer_hash = 0;
  int64_t vocab_size = 0;
  int32_t eos_id = 0;
  SplitManifest train, val;
  std::vector<std::string> inputs;
  double unigram_entropy = 0.0;  // nats per token, train split
};

// Reads DIR/manifest.json. Throws DataError naming the file (and key) when it is missing or
// malformed.
DatasetManifest read_manifest(const std::string& dir);
// Writes DIR/manifest.json atomically (temporary file, fsync, rename). Throws IoError.
void write_manifest(const std::string& dir, const DatasetManifest& manifest);

// One split of a dataset as a single token stream (its shards in manifest order). A local
// dataset's shards are all validated on opening (header, checksums, agreement with the
// manifest). A dataset at s3://BUCKET/PREFIX is read through a cache under cache_dir: each shard
// fetched whole on first use (object_cache.h: large ranged GETs, once per node), validated the
// same way, the next one fetched in the background meanwhile; a later epoch or run reads the
// cache.
class TokenStream {
 public:
  // split: "train" or "val"
  TokenStream(const std::string& dir, const std::string& split, const std::string& cache_dir = "runs/cache");
  ~TokenStream();
  TokenStream(const TokenStream&) = delete;
  TokenStream& operator=(const TokenStream&) = delete;

  const DatasetManifest& manifest() const { return manifest_; }
  uint64_t size() const { return total_; }
  // Tokens [begin, begin + n) of the stream, across shard boundaries; begin + n <= size(). From
  // one thread at a time.
  void read(uint64_t begin, uint64_t n, int32_t* out) const;

 private:
  const Shard& shard(size_t i) const;  // opened (and for s3://, fetched) on first use
  std::string fetch(size_t i) const;   // s3://: into the cache; its path
  void check_against_manifest(const Shard& shard, const ShardEntry& e) const;

  DatasetManifest manifest_;
  std::string dir_, cache_dir_;
  std::vector<ShardEntry> entries_;
  mutable std::vector<std::unique_ptr<Shard>> shards_;
  std::vector<uint64_t> starts_;  // first stream index of each shard
  uint64_t total_ = 0;
  mutable std::thread read_ahead_;  // fetching the shard after the last one opened
};

}  // namespace tessera::data
