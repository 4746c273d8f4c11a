// SentencePiece tokenizer: loading, encoding, decoding, and training a BPE model.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tessera::data {

// The bytes of the tokenizer model file `path`; throws DataError naming it when it cannot be read.
std::string read_tokenizer_file(const std::string& path);

class Tokenizer {
 public:
  // Throws DataError naming the file when it cannot be read or is not a SentencePiece model.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  // xxh64 of the model file's bytes: identifies the tokenizer in shards and checkpoints.
  uint64_t hash() const { return hash_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  uint64_t hash_ = 0;
};

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // text files, plain or .zst
  int64_t vocab_size = 4096;
  std::string out;                  // model path; "<out minus .model>.vocab" is written beside it
  int threads = 0;                  // 0: one per core; the model depends on the thread count
};

// Trains a byte-fallback BPE model (unk 0, bos 1, eos 2; digits split; full character coverage)
// on the inputs' lines. Deterministic for the same inputs and options. Throws DataError naming
// an unreadable input, IoError when `out` cannot be written, ConfigError for a bad vocab size.
void train_tokenizer(const TokenizerTrainOptions& options);

}  // namespace tessera::data
