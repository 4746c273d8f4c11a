// Tokenizers: a SentencePiece model or a Hugging Face tokenizer.json, loaded, encoding and
// decoding; training a SentencePiece BPE model.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// The bytes of the tokenizer model file `path`; throws DataError naming it when it cannot be read.
std::string read_tokenizer_file(const std::string& path);

// The names a tokenizer's file takes beside a dataset, run or model, by format; a directory is
// searched in kTokenizerFiles' order.
inline constexpr const char* kSentencePieceFile = "tokenizer.model";
inline constexpr const char* kHfTokenizerFile = "tokenizer.json";
inline constexpr std::array<const char*, 2> kTokenizerFiles = {kSentencePieceFile, kHfTokenizerFile};

// The name a copy of a tokenizer takes, from its bytes: kHfTokenizerFile for a Hugging Face
// tokenizer, else kSentencePieceFile.
const char* tokenizer_file_name(std::string_view bytes);
// The tokenizer file in `dir`, the first of kTokenizerFiles it holds; "" when it has none.
std::string tokenizer_in(const std::string& dir);

// One tokenizer format (tokenizer.cc: SentencePiece; hf_tokenizer.cc: tokenizer.json).
class TokenizerModel {
 public:
  virtual ~TokenizerModel() = default;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids) const = 0;
  virtual int64_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;  // -1: none
  virtual int32_t eos_id() const = 0;  // -1: none
  // What ends a generated continuation: the EOS, and where the vocabulary has them the tokens that
  // end a chat model's turn (Llama 3's <|eot_id|>).
  virtual std::vector<int32_t> stop_tokens() const {
    if (eos_id() < 0) return {};
    return {eos_id()};
  }
  // What the format puts before each text: tokenizer.json's BOS where its template adds one.
  virtual std::vector<int32_t> document_start() const { return {}; }
};

class Tokenizer {
 public:
  // A SentencePiece model or a tokenizer.json (hf_tokenizer.h), told apart by content. Throws
  // DataError naming the file when it cannot be read or is neither.
  explicit Tokenizer(const std::string& model_path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  std::vector<int32_t> encode(std::string_view text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  int64_t vocab_size() const;
  int32_t bos_id() const;
  int32_t eos_id() const;
  std::vector<int32_t> stop_tokens() const { return model_->stop_tokens(); }
  // What `prepare` writes before each document and `generate` before a prompt: the tokenizer's
  // own convention (Llama 3's <|begin_of_text|>), else nothing.
  std::vector<int32_t> document_start() const { return model_->document_start(); }
  // kSentencePieceFile or kHfTokenizerFile, by format.
  const char* file_name() const { return file_name_; }
  // xxh64 of the model file's bytes: identifies the tokenizer in shards and checkpoints.
  uint64_t hash() const { return hash_; }
  const std::string& path() const { return path_; }

 private:
  std::unique_ptr<TokenizerModel> model_;
  std::string path_;
  const char* file_name_ = nullptr;
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
