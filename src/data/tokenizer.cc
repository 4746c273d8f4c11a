// Tokenizers: loading either format, SentencePiece's encoding and decoding, and training a
// SentencePiece BPE model.
#include "data/tokenizer.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sched.h>
#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>
#include <unistd.h>
#include <xxhash.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <unordered_map>

#include "core/error.h"
#include "core/file_io.h"
#include "data/hf_tokenizer.h"
#include "data/text.h"

namespace tessera::data {
namespace {

int available_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}


// A file written through "<path>.tmp": created up front (so an unwritable destination fails
// before minutes of training), renamed into place by commit(), removed if never committed.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp") {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0) throw IoError(fmt::format("cannot create {}: {}", tmp_, std::strerror(errno)));
  }
  ~AtomicFile() {
    if (fd_ >= 0) {
      ::close(fd_);
      ::unlink(tmp_.c_str());
    }
  }
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void commit(const std::string& bytes) {
    write_all(fd_, bytes.data(), bytes.size(), tmp_);
    if (::fsync(fd_) != 0) throw IoError(fmt::format("cannot fsync {}: {}", tmp_, std::strerror(errno)));
    ::close(fd_);
    fd_ = -1;
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      const int err = errno;
      ::unlink(tmp_.c_str());
      throw IoError(fmt::format("cannot rename {} to {}: {}", tmp_, path_, std::strerror(err)));
    }
  }

 private:
  std::string path_, tmp_;
  int fd_ = -1;
};

// Yields the non-empty lines of the inputs, reading one file at a time (so .zst works and only
// one input is held at once). A bad input ends the iteration; the error is rethrown after Train.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<std::string>& inputs) : inputs_(inputs) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (error_.empty()) return sentencepiece::util::Status();
    return sentencepiece::util::Status(sentencepiece::util::StatusCode::kInternal, error_);
  }
  const std::string& error() const { return error_; }

 private:
  void advance() {
    for (;;) {
      while (pos_ < text_.size()) {
        size_t end = text_.find('\n', pos_);
        if (end == std::string::npos) end = text_.size();
        std::string_view line(text_.data() + pos_, end - pos_);
        pos_ = end + 1;
        if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
        if (line.find_first_not_of(" \t\r\v\f") == std::string_view::npos) continue;
        line_.assign(line);
        return;
      }
      if (next_input_ >= inputs_.size()) break;
      try {
        text_ = read_text_file(inputs_[next_input_++]);
      } catch (const DataError& e) {
        error_ = e.what();
        break;
      }
      pos_ = 0;
    }
    done_ = true;
    line_.clear();
  }

  const std::vector<std::string>& inputs_;
  size_t next_input_ = 0;
  std::string text_, line_, error_;
  size_t pos_ = 0;
  bool done_ = false;
};

}  // namespace

std::string read_tokenizer_file(const std::string& path) {
  FileBytes f = try_read_file(path);
  if (!f) throw DataError(fmt::format("cannot read tokenizer {}: {}", path, f.reason()));
  return std::move(f.bytes);
}

const char* tokenizer_file_name(std::string_view bytes) {
  return is_hf_tokenizer(bytes) ? kHfTokenizerFile : kSentencePieceFile;
}

std::string tokenizer_in(const std::string& dir) {
  for (const char* name : kTokenizerFiles) {
    const std::filesystem::path p = std::filesystem::path(dir) / name;
    if (std::filesystem::exists(p)) return p.string();
  }
  return "";
}

namespace {

class SentencePieceModel : public TokenizerModel {
 public:
  SentencePieceModel(const std::string& bytes, const std::string& path) : path_(path) {
    const auto status = sp_.LoadFromSerializedProto(bytes);
    if (!status.ok() || sp_.GetPieceSize() <= 0) {
      throw DataError(fmt::format("tokenizer {} is neither a SentencePiece model nor a tokenizer.json: {}", path,
                                  status.ToString()));
    }
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    if (!status.ok()) throw DataError(fmt::format("tokenizer {}: cannot encode: {}", path_, status.ToString()));
    return std::vector<int32_t>(ids.begin(), ids.end());
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string text;
    const auto status = sp_.Decode(std::vector<int>(ids.begin(), ids.end()), &text);
    if (!status.ok()) throw DataError(fmt::format("tokenizer {}: cannot decode: {}", path_, status.ToString()));
    return text;
  }

  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  int32_t bos_id() const override { return sp_.bos_id(); }
  int32_t eos_id() const override { return sp_.eos_id(); }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string path_;
};

}  // namespace

Tokenizer::Tokenizer(const std::string& model_path) : path_(model_path) {
  const std::string bytes = read_tokenizer_file(model_path);
  if (bytes.empty()) throw DataError(fmt::format("tokenizer {} is empty", model_path));
  if (is_hf_tokenizer(bytes)) {
    model_ = load_hf_tokenizer(bytes, model_path);
  } else {
    model_ = std::make_unique<SentencePieceModel>(bytes, model_path);
  }
  file_name_ = tokenizer_file_name(bytes);
  hash_ = XXH64(bytes.data(), bytes.size(), 0);
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(std::string_view text) const { return model_->encode(text); }
std::string Tokenizer::decode(const std::vector<int32_t>& ids) const { return model_->decode(ids); }
int64_t Tokenizer::vocab_size() const { return model_->vocab_size(); }
int32_t Tokenizer::bos_id() const { return model_->bos_id(); }
int32_t Tokenizer::eos_id() const { return model_->eos_id(); }

void train_tokenizer(const TokenizerTrainOptions& options) {
  constexpr std::string_view kSuffix = ".model";
  if (!options.out.ends_with(kSuffix) || options.out.size() == kSuffix.size()) {
    throw ConfigError(fmt::format("--out {}: the tokenizer model name must end in .model", options.out));
  }
  // Byte fallback needs 256 byte pieces and unk/bos/eos; above 2^20 nothing is practical.
  if (options.vocab_size < 260 || options.vocab_size > (int64_t{1} << 20)) {
    throw ConfigError(
        fmt::format("--vocab-size {}: must be in [260, 1048576] (256 byte pieces, unk, bos, eos, "
                    "and at least one merge)",
                    options.vocab_size));
  }
  if (options.inputs.empty()) throw ConfigError("tokenizer training needs at least one --input file");
  if (options.threads < 0) throw ConfigError(fmt::format("--threads {}: must be >= 0", options.threads));
  for (const std::string& in : options.inputs) {
    if (::access(in.c_str(), R_OK) != 0) throw DataError(fmt::format("cannot open {}: {}", in, std::strerror(errno)));
  }

  const std::string prefix = options.out.substr(0, options.out.size() - kSuffix.size());
  AtomicFile model_file(options.out);
  AtomicFile vocab_file(prefix + ".vocab");

  // Identity normalization and kept whitespace (as Llama's tokenizer): the default NFKC rule
  // folds newlines and runs of spaces, so decode(encode(text)) would not give the text back.
  // The model and vocab are written by us (atomically), not by SentencePiece: with a model
  // output, SentencePiece refuses a model_prefix.
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(options.vocab_size)},
      {"byte_fallback", "true"},
      {"split_digits", "true"},
      {"character_coverage", "1.0"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"unk_id", "0"},
      {"bos_id", "1"},
      {"eos_id", "2"},
      {"pad_id", "-1"},
      {"num_threads", std::to_string(options.threads > 0 ? options.threads : available_cores())},
      {"minloglevel", "1"},
  };
  LineIterator lines(options.inputs);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!lines.error().empty()) throw DataError(lines.error());
  if (!status.ok()) {
    const std::string msg = status.ToString();
    if (msg.find("ocabulary size") != std::string::npos) {
      throw ConfigError(fmt::format("--vocab-size {}: {}", options.vocab_size, msg));
    }
    throw DataError(fmt::format("tokenizer training on {} failed: {}", options.inputs[0], msg));
  }

  sentencepiece::SentencePieceProcessor sp;
  if (const auto s = sp.LoadFromSerializedProto(model); !s.ok()) {
    throw DataError(fmt::format("tokenizer training produced an unreadable model: {}", s.ToString()));
  }
  std::string vocab;
  for (int id = 0; id < sp.GetPieceSize(); ++id) vocab += fmt::format("{}\t{}\n", sp.IdToPiece(id), sp.GetScore(id));
  model_file.commit(model);
  vocab_file.commit(vocab);
}

}  // namespace tessera::data
