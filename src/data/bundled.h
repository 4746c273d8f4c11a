// The corpus that ships with Tessera (data/kjv.txt.zst), tokenized on first use into a cache.
#pragma once

#include <cstdint>
#include <string>

namespace tessera::data {

// Path of the bundled corpus: $TESSERA_DATA_DIR/kjv.txt.zst when that variable is set, else the
// source tree's data/ directory recorded at build time.
std::string bundled_corpus_path();

// The prepared dataset directory for the bundled corpus and a tokenizer of `vocab_size` under
// cache_dir. On first use, trains the tokenizer and runs prepare (2% of documents for
// validation, one worker per core) into a temporary directory that is renamed into place, so
// an interrupted preparation is never mistaken for a finished one.
std::string ensure_bundled_dataset(const std::string& cache_dir, int64_t vocab_size);

// The dataset directory to train on: "" for synthetic tokens, the prepared bundled corpus for
// "bundled" (ensure_bundled_dataset), else `dataset` itself, which must hold a manifest.json
// (DataError naming data.dataset otherwise).
std::string resolve_dataset(bool synthetic, const std::string& dataset, const std::string& cache_dir,
                            int64_t vocab_size);

}  // namespace tessera::data
