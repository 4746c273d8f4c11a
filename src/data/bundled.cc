// The bundled corpus, tokenized on first use.
#include "data/bundled.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include "core/error.h"
#include "core/log.h"
#include "core/threads.h"
#include "data/prepare.h"
#include "data/tokenizer.h"
#include "storage/object_url.h"

namespace tessera::data {

namespace fs = std::filesystem;

std::string bundled_corpus_path() {
  const char* dir = std::getenv("TESSERA_DATA_DIR");
  return fmt::format("{}/kjv.txt.zst", dir != nullptr ? dir : TESSERA_DATA_DIR);
}

std::string ensure_bundled_dataset(const std::string& cache_dir, int64_t vocab_size) {
  // The name carries what determines the contents, so a change makes a new dataset, never a stale one.
  const fs::path final_dir = fs::path(cache_dir) / fmt::format("kjv-bpe{}-v1", vocab_size);
  if (fs::exists(final_dir / "manifest.json")) return final_dir.string();

  const std::string corpus = bundled_corpus_path();
  if (!fs::exists(corpus)) {
    throw DataError(
        fmt::format("bundled corpus {} not found (set TESSERA_DATA_DIR to the directory holding "
                    "kjv.txt.zst, or set data.dataset)",
                    corpus));
  }
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  if (ec) throw IoError(fmt::format("cannot create data.cache_dir {}: {}", cache_dir, ec.message()));
  const fs::path tmp = fs::path(cache_dir) / fmt::format(".{}.tmp-{}", final_dir.filename().string(), getpid());
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) throw IoError(fmt::format("cannot create {}: {}", tmp.string(), ec.message()));

  log::info("first use of the bundled corpus: training a {}-token BPE tokenizer on {}", vocab_size, corpus);
  data::TokenizerTrainOptions tok;
  tok.inputs = {corpus};
  tok.vocab_size = vocab_size;
  tok.out = (tmp / "bpe.model").string();
  data::train_tokenizer(tok);

  data::PrepareOptions prep;
  prep.inputs = {corpus};
  prep.tokenizer = tok.out;
  prep.out = (tmp / "dataset").string();
  prep.workers = num_threads();
  prep.val_fraction = 0.02;
  const data::PrepareStats stats = data::prepare(prep);
  log::info("tokenized {:.1f} MB into {} train + {} validation tokens in {:.1f}s ({} workers)",
            static_cast<double>(stats.bytes) / 1e6, stats.train_tokens, stats.val_tokens, stats.seconds, prep.workers);

  fs::rename(tmp / "dataset", final_dir, ec);
  if (ec && !fs::exists(final_dir / "manifest.json")) {  // another process may have won the race
    throw IoError(fmt::format("cannot move the prepared dataset to {}: {}", final_dir.string(), ec.message()));
  }
  fs::remove_all(tmp, ec);
  return final_dir.string();
}

std::string resolve_dataset(bool synthetic, const std::string& dataset, const std::string& cache_dir,
                            int64_t vocab_size) {
  if (synthetic) return "";
  if (dataset == "bundled") return ensure_bundled_dataset(cache_dir, vocab_size);
  if (storage::is_s3(dataset)) return dataset;  // its manifest is read (and checked) when opened
  if (!std::filesystem::exists(std::filesystem::path(dataset) / "manifest.json")) {
    throw DataError(
        fmt::format("data.dataset = {}: no manifest.json there (prepare one with `tessera prepare`)", dataset));
  }
  return dataset;
}

}  // namespace tessera::data
