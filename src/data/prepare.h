// `tessera prepare`: parallel, shared-nothing tokenization of text into a dataset directory.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tessera::data {

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or glob patterns; .zst files are decompressed
  std::string tokenizer;            // SentencePiece model
  std::string out;                  // dataset directory (created)
  int workers = 1;                  // worker processes
  double val_fraction = 0.0;        // share of documents that go to the validation split
  uint64_t shard_tokens = 1 << 24;  // tokens per shard before a new one starts
  uint64_t seed = 0;                // picks the validation documents
};

struct PrepareStats {
  uint64_t bytes = 0;  // input text bytes (after decompression)
  uint64_t train_tokens = 0, val_tokens = 0, documents = 0;
  int shards = 0;
  double seconds = 0.0;
};

// Worker k of K (a forked process) takes inputs k, k+K, ...; when there are fewer inputs than
// workers, each input is cut at document boundaries into pieces so that every worker has work.
// Documents go to the validation split by a hash of (seed, input file name, document index), so the split
// does not depend on the worker count. Every shard is written under a temporary name and
// renamed; manifest.json is written last, so a directory without it is not a dataset. Errors
// name the file: DataError for bad input (missing, empty, not UTF-8) or tokenizer, IoError for
// an unwritable output.
PrepareStats prepare(const PrepareOptions& options);

}  // namespace tessera::data
