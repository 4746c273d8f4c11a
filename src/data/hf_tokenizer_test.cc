// tokenizer.json (byte-level BPE): merges by rank, ignore_merges, the pre-tokenizers' pieces
// (GPT-2's and Llama 3's patterns, Digits, Removed), added tokens, decoding to bytes, the template
// BOS, and errors that name the key. Against the real Llama 3 tokenizer and Hugging Face's own
// implementation: tests/hf_tokenizer_check.mjs.
#include "data/hf_tokenizer.h"

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>

#include "core/error.h"
#include "core/file_io.h"
#include "core/json.h"
#include "data/hf_tokenizer_test_util.h"

namespace tessera::data {
namespace {

using nlohmann::json;

using namespace test;  // NOLINT: the helpers of hf_tokenizer_test_util.h

class HfTokenizer : public ::testing::Test {
 protected:
  void TearDown() override { std::filesystem::remove(path_); }

  Tokenizer load(const json& j) {
    write_file_atomic(path_, dump_json(j));
    return Tokenizer(path_);
  }
  // The id of `word` in j's vocabulary.
  static int32_t id(const json& j, const std::string& word) {
    return j["model"]["vocab"].at(mapped(word)).get<int32_t>();
  }
  // The pieces `ids` decode to one by one.
  static std::vector<std::string> pieces(const Tokenizer& t, const std::vector<int32_t>& ids) {
    std::vector<std::string> out;
    for (const int32_t i : ids) out.push_back(t.decode({i}));
    return out;
  }
  std::string message_of(const json& j) {
    try {
      load(j);
    } catch (const DataError& e) {
      return e.what();
    }
    return "(loaded)";
  }

  std::string path_ = fmt::format("{}/hf_tokenizer_test_{}.json", ::testing::TempDir(), ::getpid());
};

TEST_F(HfTokenizer, MergesTheLowestRankFirstWhereverItIs) {
  // "b c" ranks before "a b": abc is a + bc, not ab + c.
  const json j = tokenizer_json({"ab", "bc"}, {{"b", "c"}, {"a", "b"}}, byte_level());
  const Tokenizer t = load(j);
  EXPECT_EQ(t.encode("abc"), (std::vector<int32_t>{'a', id(j, "bc")}));
  EXPECT_EQ(t.encode("abd"), (std::vector<int32_t>{id(j, "ab"), 'd'}));
  EXPECT_EQ(t.file_name(), std::string("tokenizer.json"));
  EXPECT_EQ(t.vocab_size(), 258);
}

TEST_F(HfTokenizer, MergesARunInLinearithmicTimeAndLeftmostFirst) {
  const json j = tokenizer_json({"aa"}, {{"a", "a"}}, byte_level());
  const Tokenizer t = load(j);
  EXPECT_EQ(t.encode("aaa"), (std::vector<int32_t>{id(j, "aa"), 'a'}));
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int32_t> ids = t.encode(std::string(200001, 'a'));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(2));  // a quadratic merge takes minutes
  ASSERT_EQ(ids.size(), 100001u);
  EXPECT_EQ(ids.back(), 'a');
  EXPECT_EQ(ids.front(), id(j, "aa"));
}

TEST_F(HfTokenizer, IgnoreMergesTakesAWordOfTheVocabularyWhole) {
  // "xyz" is in the vocabulary, but no merge makes it.
  json j = tokenizer_json({"xyz"}, {}, byte_level(), /*ignore_merges=*/true);
  EXPECT_EQ(load(j).encode("xyz"), (std::vector<int32_t>{id(j, "xyz")}));
  j["model"]["ignore_merges"] = false;
  EXPECT_EQ(load(j).encode("xyz"), (std::vector<int32_t>{'x', 'y', 'z'}));
}

// With ignore_merges and every expected piece in the vocabulary, each piece comes back as one
// token: the ids show where the pre-tokenizers cut. The pieces are those of JavaScript's regex
// engine on the same patterns.
TEST_F(HfTokenizer, PiecesOfGpt2sPattern) {
  const std::vector<std::string> want = {"Hello", " ", " world", "'s", " 123"};
  const Tokenizer t = load(tokenizer_json(want, {}, byte_level(), true));
  EXPECT_EQ(pieces(t, t.encode("Hello  world's 123")), want);
  // U+0085 (NEL) is white space to Oniguruma's \s, which the Rust library runs the pattern with
  // (JavaScript's \s lacks it: tokenizers.js gives " \u0085" as one piece).
  const std::vector<std::string> nel = {"Hello", " ", "\u0085", "world"};
  const Tokenizer u = load(tokenizer_json(nel, {}, byte_level(), true));
  EXPECT_EQ(pieces(u, u.encode("Hello \u0085world")), nel);
}

TEST_F(HfTokenizer, PiecesOfLlama3sPattern) {
  const std::vector<std::string> want = {"I", "'m", "  ", " ", "123", "45", " tokens", "!\n\n", "OK", "  "};
  const Tokenizer t = load(tokenizer_json(want, {}, llama3_pre_tokenizer(), true));
  EXPECT_EQ(pieces(t, t.encode("I'm   12345 tokens!\n\nOK  ")), want);
  // (?i:): the contraction matches in capitals too.
  const Tokenizer u = load(tokenizer_json({"IT", "'S"}, {}, llama3_pre_tokenizer(), true));
  EXPECT_EQ(pieces(u, u.encode("IT'S")), (std::vector<std::string>{"IT", "'S"}));
}

TEST_F(HfTokenizer, DigitsAndRemovedSplits) {
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"String", "|"}}}, {"behavior", "Removed"}},
                {{"type", "Digits"}, {"individual_digits", true}},
                byte_level(false)}}};
  Tokenizer t = load(tokenizer_json({"ab"}, {}, pre, true));
  EXPECT_EQ(pieces(t, t.encode("ab|12|")), (std::vector<std::string>{"ab", "1", "2"}));
  pre["pretokenizers"][1]["individual_digits"] = false;
  t = load(tokenizer_json({"ab", "12"}, {}, pre, true));
  EXPECT_EQ(pieces(t, t.encode("ab|12|")), (std::vector<std::string>{"ab", "12"}));
}

TEST_F(HfTokenizer, AddedTokensMatchFirstLongestFirst) {
  json j = tokenizer_json({}, {}, llama3_pre_tokenizer());
  j["added_tokens"] = {{{"id", 300}, {"content", "<|x|>"}, {"special", true}},
                       {{"id", 301}, {"content", "<|xy|>"}, {"special", true}},
                       {{"id", 302}, {"content", "<|end_of_text|>"}, {"special", true}},
                       {{"id", 303}, {"content", "<|x|>!"}, {"special", false}}};
  const Tokenizer t = load(j);
  EXPECT_EQ(t.encode("a<|xy|>b<|x|><|x"), (std::vector<int32_t>{'a', 301, 'b', 300, '<', '|', 'x'}));
  EXPECT_EQ(t.encode("<|x|>!<|x|>?"), (std::vector<int32_t>{303, 300, '?'}));
  EXPECT_EQ(t.decode({'a', 301, 'b'}), "a<|xy|>b");
  EXPECT_EQ(t.vocab_size(), 304);
  EXPECT_EQ(t.eos_id(), 302);
  EXPECT_EQ(t.bos_id(), -1);
  EXPECT_TRUE(t.document_start().empty());
  EXPECT_EQ(t.stop_tokens(), (std::vector<int32_t>{302}));
  EXPECT_THROW(t.decode({299}), DataError);  // no token has id 299
}

// Generation stops at the EOS and at each end of a chat turn the vocabulary has (Llama 3.1
// Instruct's generation_config.json lists 128001, 128008 and 128009), each once.
TEST_F(HfTokenizer, GenerationStopsAtTheEosAndTheEndsOfATurn) {
  json j = tokenizer_json({}, {}, llama3_pre_tokenizer());
  add_llama3_specials(j, 256);
  j["added_tokens"].push_back({{"id", 258}, {"content", "<|eom_id|>"}, {"special", true}});
  j["added_tokens"].push_back({{"id", 259}, {"content", "<|eot_id|>"}, {"special", true}});
  EXPECT_EQ(load(j).stop_tokens(), (std::vector<int32_t>{257, 259, 258}));
  j["added_tokens"] = {{{"id", 256}, {"content", "<|im_end|>"}, {"special", true}},
                       {{"id", 257}, {"content", "<|endoftext|>"}, {"special", true}}};
  j.erase("post_processor");
  EXPECT_EQ(load(j).stop_tokens(), (std::vector<int32_t>{257, 256}));  // SmolLM's ChatML
  j["added_tokens"] = {{{"id", 256}, {"content", "<|im_end|>"}, {"special", true}}};
  const Tokenizer none = load(j);
  EXPECT_EQ(none.eos_id(), -1);
  EXPECT_EQ(none.stop_tokens(), (std::vector<int32_t>{256}));
}

TEST_F(HfTokenizer, TheTemplatesBosStartsEachDocument) {
  json j = tokenizer_json({}, {}, llama3_pre_tokenizer());
  add_llama3_specials(j, 256);
  const Tokenizer t = load(j);
  EXPECT_EQ(t.bos_id(), 256);
  EXPECT_EQ(t.eos_id(), 257);
  EXPECT_EQ(t.document_start(), (std::vector<int32_t>{256}));
  EXPECT_EQ(t.encode("hi"), (std::vector<int32_t>{'h', 'i'}));  // encoding itself adds nothing
}

TEST_F(HfTokenizer, DecodesBytesAndReplacesWhatIsNotUtf8) {
  const Tokenizer t = load(tokenizer_json({}, {}, llama3_pre_tokenizer()));
  const std::string text = "h\xC3\xA9llo \xF0\x9F\x99\x82\n\t\r end";  // é, an emoji, controls
  const std::vector<int32_t> ids = t.encode(text);
  EXPECT_EQ(ids.size(), text.size());  // no merges: one token a byte
  for (size_t i = 0; i < text.size(); ++i) EXPECT_EQ(ids[i], static_cast<unsigned char>(text[i]));
  EXPECT_EQ(t.decode(ids), text);
  EXPECT_EQ(t.decode({0xF0, 0x9F}), "\xEF\xBF\xBD");  // an emoji's first two bytes: one U+FFFD
  // A stray continuation byte and a truncated sequence in the input read as U+FFFD each.
  EXPECT_EQ(t.encode("a\x80"
                     "b\xE2\x82"),
            t.encode("a\xEF\xBF\xBD"
                     "b\xEF\xBF\xBD"));
}

TEST_F(HfTokenizer, ErrorsNameTheKey) {
  const json good = tokenizer_json({"ab"}, {{"a", "b"}}, llama3_pre_tokenizer());
  json j = good;
  j["normalizer"] = {{"type", "NFC"}};
  EXPECT_NE(message_of(j).find("normalizer.type \"NFC\" is not implemented"), std::string::npos) << message_of(j);
  j = good;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}};
  EXPECT_NE(message_of(j).find("pre_tokenizer.split is true (the default): Metaspace's split is not implemented"),
            std::string::npos)
      << message_of(j);
  j = good;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  EXPECT_NE(message_of(j).find("pre_tokenizer.pretokenizers[0].pattern: the regex cannot be compiled"),
            std::string::npos)
      << message_of(j);
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\C";  // one byte: would cut a character
  EXPECT_NE(message_of(j).find("the regex cannot be compiled"), std::string::npos) << message_of(j);
  j = good;
  j["model"]["merges"][0] = "a q";
  EXPECT_NE(message_of(j).find("model.merges[0] merges \"a\" and \"q\""), std::string::npos) << message_of(j);
  j = good;
  j["model"]["vocab"].erase(byte_char(0x0A));
  EXPECT_NE(message_of(j).find("model.vocab has no token for byte 0x0a"), std::string::npos) << message_of(j);
  j = good;
  j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0];
  EXPECT_NE(message_of(j).find("has no ByteLevel step"), std::string::npos) << message_of(j);
  j = good;
  j["model"]["byte_fallback"] = true;
  EXPECT_NE(message_of(j).find("model.byte_fallback"), std::string::npos) << message_of(j);
  j = good;
  j["added_tokens"] = {{{"id", 9}, {"content", "<x>"}, {"lstrip", true}}};
  EXPECT_NE(message_of(j).find("added_tokens[0].lstrip"), std::string::npos) << message_of(j);
  j = good;
  j["post_processor"] = 5;
  EXPECT_NE(message_of(j).find("post_processor is not an object"), std::string::npos) << message_of(j);
  j["post_processor"] = {{"type", 5}, {"processors", {7, {{"type", {1}}}}}};  // no template: read as none
  EXPECT_EQ(message_of(j), "(loaded)");
  j = json::array();  // "[]" is not told apart as JSON: only an object is a tokenizer.json
  EXPECT_NE(message_of(j).find("neither a SentencePiece model nor a tokenizer.json"), std::string::npos);
  EXPECT_EQ(message_of(good), "(loaded)");
}

// Characters, not bytes, start the merges; a character outside the vocabulary falls back to its
// bytes' tokens, or to the unk token where one of them is missing (one for a run with fuse_unk).
// Each stretch between added tokens is normalized on its own, so each gets its "▁".
TEST_F(HfTokenizer, SentencePieceStyleWithByteFallback) {
  const int32_t space_a = 263, b = 261, e_acute = 262, ab = 264;
  const Tokenizer t = load(sentencepiece_style(false));
  EXPECT_EQ(t.encode("ab a"), (std::vector<int32_t>{space_a, b, space_a}));  // "▁ a" ranks before "a b"
  EXPECT_EQ(t.encode("a\u00e9b"), (std::vector<int32_t>{space_a, e_acute, b}));
  EXPECT_EQ(t.encode("<s>ab</s>ab"), (std::vector<int32_t>{1, space_a, b, 2, space_a, b}));
  EXPECT_EQ(t.encode("z\u00e8"), (std::vector<int32_t>{259, 3 + 'z', 3 + 0xC3, 3 + 0xA8}));
  EXPECT_EQ(t.encode(""), std::vector<int32_t>{});
  EXPECT_EQ(t.decode({space_a, b, space_a}), "ab a");  // the leading space stripped
  EXPECT_EQ(t.decode({1, space_a}), "<s> a");          // ... only where the text starts with it
  EXPECT_EQ(t.decode({259, 3 + 'z', 3 + 0xC3, 3 + 0xA8, ab}), "z\u00e8ab");
  EXPECT_EQ(t.decode({3 + 0xC3, b}),
            "\xEF\xBF\xBD"
            "b");  // a byte run that is not UTF-8: U+FFFD a byte
  EXPECT_EQ(t.decode({3 + 0xF0, 3 + 0x9F}), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(t.document_start(), std::vector<int32_t>{});  // no template here
  EXPECT_EQ(t.eos_id(), 2);
  EXPECT_EQ(t.bos_id(), 1);

  EXPECT_EQ(load(sentencepiece_style(false, 'z')).encode("zz a"), (std::vector<int32_t>{259, 0, 0, space_a}));
  EXPECT_EQ(load(sentencepiece_style(true, 'z')).encode("zz a"), (std::vector<int32_t>{259, 0, space_a}));
}

// The newer spelling of the same tokenizer (transformers' converter with legacy = false): no
// normalizer; a Metaspace pre-tokenizer puts "▁" for spaces and, with prepend_scheme "first",
// before the text's first piece only, not after an added token; the Metaspace decoder.
TEST_F(HfTokenizer, SentencePieceStyleWithMetaspace) {
  const int32_t space_a = 263, b = 261, ab = 264;
  json j = sentencepiece_style(false);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {
      {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
  const Tokenizer first = load(j);
  EXPECT_EQ(first.encode("ab a"), (std::vector<int32_t>{space_a, b, space_a}));
  EXPECT_EQ(first.encode("<s>ab a"), (std::vector<int32_t>{1, ab, space_a}));  // no "▁" after <s>
  EXPECT_EQ(first.encode(" a"), (std::vector<int32_t>{space_a}));              // already starts with one
  EXPECT_EQ(first.decode({space_a, b, space_a}), "ab a");
  EXPECT_EQ(first.decode({1, space_a}), "<s> a");  // only the first token's leading space goes
  j["pre_tokenizer"]["prepend_scheme"] = "always";
  EXPECT_EQ(load(j).encode("<s>ab a"), (std::vector<int32_t>{1, space_a, b, space_a}));
  j["pre_tokenizer"]["prepend_scheme"] = "never";
  EXPECT_EQ(load(j).encode("ab a"), (std::vector<int32_t>{ab, space_a}));
  j["pre_tokenizer"]["prepend_scheme"] = "sometimes";
  EXPECT_NE(message_of(j).find("pre_tokenizer.prepend_scheme = \"sometimes\" is not always, first or never"),
            std::string::npos)
      << message_of(j);
}

TEST_F(HfTokenizer, SentencePieceStyleRefusalsNameTheKey) {
  json j = sentencepiece_style(false);
  j["normalizer"]["normalizers"][1]["pattern"] = {{"Regex", " +"}};
  EXPECT_NE(message_of(j).find("normalizer.normalizers[1].pattern is not {\"String\""), std::string::npos)
      << message_of(j);
  j = sentencepiece_style(false);
  j["decoder"]["decoders"][0] = {{"type", "CTC"}};
  EXPECT_NE(message_of(j).find("decoder.decoders[0].type \"CTC\" is not implemented"), std::string::npos)
      << message_of(j);
  j = sentencepiece_style(false);
  j["model"]["byte_fallback"] = false;
  EXPECT_NE(message_of(j).find("model.byte_fallback is not true, and the pre_tokenizer has no ByteLevel step"),
            std::string::npos)
      << message_of(j);
  j = sentencepiece_style(false);
  j["model"]["unk_token"] = "<nope>";
  EXPECT_NE(message_of(j).find("model.unk_token \"<nope>\" is not in the vocabulary"), std::string::npos)
      << message_of(j);
  j = sentencepiece_style(false, 'z');
  j["model"].erase("unk_token");
  const Tokenizer no_unk = load(j);
  EXPECT_THROW(no_unk.encode("z"), DataError);
}

TEST(HfTokenizerFormat, ToldApartFromSentencePieceByContent) {
  EXPECT_TRUE(is_hf_tokenizer("\n  {\"model\": {}}"));
  EXPECT_FALSE(is_hf_tokenizer("\x0a\x0b<unk>"));
  EXPECT_FALSE(is_hf_tokenizer(""));
  EXPECT_STREQ(tokenizer_file_name("{}"), "tokenizer.json");
  EXPECT_STREQ(tokenizer_file_name("\x0a"), "tokenizer.model");
}

}  // namespace
}  // namespace tessera::data
