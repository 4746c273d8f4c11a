// Tokenizer: training is deterministic and gives the documented ids; encode/decode keep the text
// (newlines, spaces, bytes outside the training alphabet); bad options and files are named.
#include "data/tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <xxhash.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "core/file_io.h"

namespace tessera::data {
namespace {

namespace fs = std::filesystem;

// A few KB of lowercase pseudo-English: ~30 distinct characters, so vocab 300 leaves merges.
std::string corpus(int documents, uint32_t seed) {
  static const char* kWords[] = {"the", "and", "of",    "to",   "in",    "light", "water", "earth", "seed", "day",
                                 "was", "he",  "said",  "unto", "them",  "land",  "fruit", "night", "good", "made",
                                 "let", "be",  "there", "it",   "every", "after", "his",   "kind",  "form", "void"};
  std::mt19937 rng(seed);
  std::string text;
  for (int d = 0; d < documents; ++d) {
    const int lines = 1 + static_cast<int>(rng() % 4);
    for (int l = 0; l < lines; ++l) {
      const int words = 3 + static_cast<int>(rng() % 10);
      for (int w = 0; w < words; ++w) text += std::string(w ? " " : "") + kWords[rng() % std::size(kWords)];
      text += rng() % 3 ? ".\n" : ", 12 and 345.\n";
    }
    text += "\n";
  }
  return text;
}

class TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(::testing::TempDir()) /
           fmt::format("tessera_tok_{}_{}", ::testing::UnitTest::GetInstance()->current_test_info()->name(), getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    input_ = (dir_ / "corpus.txt").string();
    std::ofstream(input_) << corpus(60, 1);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  TokenizerTrainOptions options(const std::string& out, int64_t vocab = 300) const {
    TokenizerTrainOptions o;
    o.inputs = {input_};
    o.vocab_size = vocab;
    o.out = out;
    o.threads = 2;
    return o;
  }
  fs::path dir_;
  std::string input_;
};

TEST_F(TokenizerTest, TrainingIsDeterministicWithDocumentedIds) {
  train_tokenizer(options(path("a.model")));
  train_tokenizer(options(path("b.model")));
  const std::string a = read_file(path("a.model")), b = read_file(path("b.model"));
  ASSERT_FALSE(a.empty());
  EXPECT_EQ(a, b);
  EXPECT_FALSE(fs::exists(path("a.model.tmp")));
  EXPECT_TRUE(fs::exists(path("a.vocab")));

  const Tokenizer tok(path("a.model"));
  EXPECT_EQ(tok.vocab_size(), 300);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_EQ(tok.hash(), XXH64(a.data(), a.size(), 0));
  EXPECT_EQ(tok.path(), path("a.model"));
  std::ifstream vocab(path("a.vocab"));
  int lines = 0;
  for (std::string line; std::getline(vocab, line);) ++lines;
  EXPECT_EQ(lines, 300);
}

TEST_F(TokenizerTest, EncodeDecodeKeepsTheText) {
  train_tokenizer(options(path("t.model")));
  Tokenizer tok(path("t.model"));
  const std::string texts[] = {
      "the light was good.\nand the earth was void.",
      "  two  spaces\tand a tab\n\nand 2024 digits 0123",
      "bytes outside the alphabet: caf\xC3\xA9 \xE2\x82\xAC \xF0\x9F\x98\x80 Q",
  };
  for (const std::string& t : texts) {
    const std::vector<int32_t> ids = tok.encode(t);
    ASSERT_FALSE(ids.empty());
    for (const int32_t id : ids) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, tok.vocab_size());
      EXPECT_NE(id, 0) << "byte fallback leaves no <unk>";
    }
    EXPECT_EQ(tok.decode(ids), t);
  }
  // Digits are split: "2024" is four pieces at most one digit long.
  const std::vector<int32_t> ids = tok.encode("2024");
  EXPECT_GE(ids.size(), 4u);
  // Training taught merges: common words are shorter than their bytes.
  EXPECT_LT(tok.encode("the light and the water").size(), 12u);
  // Move keeps the model usable.
  Tokenizer moved = std::move(tok);
  EXPECT_EQ(moved.decode(moved.encode("the seed")), "the seed");
}

TEST_F(TokenizerTest, BadOptionsAndFilesAreNamed) {
  auto message = [](auto&& fn) -> std::string {
    try {
      fn();
    } catch (const Error& e) {
      return e.what();
    }
    return "(no error)";
  };
  EXPECT_THROW(train_tokenizer(options(path("v.model"), 100)), ConfigError);
  EXPECT_THROW(train_tokenizer(options(path("v.model"), (int64_t{1} << 20) + 1)), ConfigError);
  EXPECT_THROW(train_tokenizer(options(path("v.bin"))), ConfigError);
  auto o = options(path("m.model"));
  o.inputs = {path("missing.txt")};
  EXPECT_THROW(train_tokenizer(o), DataError);
  EXPECT_NE(message([&] { train_tokenizer(o); }).find(path("missing.txt")), std::string::npos);
  o.inputs = {input_, path("empty.txt")};
  std::ofstream(path("empty.txt")).close();
  EXPECT_NE(message([&] { train_tokenizer(o); }).find(path("empty.txt") + " is empty"), std::string::npos);
  EXPECT_FALSE(fs::exists(path("m.model")));
  EXPECT_FALSE(fs::exists(path("m.model.tmp")));
  // Under a regular file: nothing can be created there.
  EXPECT_THROW(train_tokenizer(options(input_ + "/x.model")), IoError);

  std::ofstream(path("garbage.model")) << "not a sentencepiece model at all";
  EXPECT_THROW(Tokenizer(path("garbage.model")), DataError);
  EXPECT_NE(message([&] { Tokenizer t(path("garbage.model")); }).find(path("garbage.model")), std::string::npos);
  EXPECT_NE(message([&] { Tokenizer t(path("none.model")); }).find(path("none.model")), std::string::npos);
  std::ofstream(path("empty.model")).close();
  EXPECT_NE(message([&] { Tokenizer t(path("empty.model")); }).find(path("empty.model")), std::string::npos);
}

}  // namespace
}  // namespace tessera::data
