// Fuzzes the tokenizer.json reader and the BPE it builds, byte-level or SentencePiece-style
// (data::Tokenizer over hf_tokenizer.cc). Each input is tried as the file, then as a recipe: a small valid tokenizer
// whose Split pattern, merges, added tokens and flags come from the input, and text from the
// input encoded with it. An accepted tokenizer gives ids inside its vocabulary for any text (text
// that is not UTF-8 included) and decodes them; a recipe's tokenizer (Isolated splits, no prefix
// space, added tokens of printable ASCII) decodes valid UTF-8 back to the text itself.
#include <fuzzer/FuzzedDataProvider.h>

#include <optional>
#include <string>
#include <vector>

#include "core/file_io.h"
#include "core/json.h"
#include "data/hf_tokenizer_test_util.h"
#include "data/text.h"
#include "data/tokenizer.h"
#include "harness.h"

namespace tessera::fuzz {
namespace {

using nlohmann::json;

// Encodes `text`, checks every id against the vocabulary, decodes; with `lossless`, valid UTF-8
// comes back unchanged.
void check_text(const data::Tokenizer& tok, const std::string& text, bool lossless) {
  std::vector<int32_t> ids;
  if (!parses([&] { ids = tok.encode(text); })) return;
  for (const int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  std::string back;
  FUZZ_CHECK(parses([&] { back = tok.decode(ids); }));
  if (lossless && data::find_invalid_utf8(text) < 0) FUZZ_CHECK(back == text);
  FUZZ_CHECK(data::find_invalid_utf8(back) < 0);
}

const char* const kTexts[] = {
    "Hello world! I'm 12345 <|end_of_text|>",
    "  \n\n\t x\r\n",
    "\xC3\xA9\xF0\x9F\x99\x82\xE4\xB8\xAD",
    "\x80\xFF\xC3 bad \xE2\x82",
    "",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
};

void check_file(const std::string& path) {
  std::optional<data::Tokenizer> tok;
  if (!parses([&] { tok.emplace(path); })) return;
  FUZZ_CHECK(tok->vocab_size() > 0);
  for (const char* t : kTexts) check_text(*tok, t, false);
}

std::string ascii_token(FuzzedDataProvider& p) {
  std::string s = "<|" + p.ConsumeRandomLengthString(6) + "|>";
  for (char& c : s) c = static_cast<char>(' ' + 1 + static_cast<unsigned char>(c) % 94);  // '!'..'~'
  return s;
}

// A valid tokenizer, varied where the reader and the merge loop branch.
json recipe(FuzzedDataProvider& p) {
  static const char* const kPatterns[] = {
      data::test::kLlama3Pattern, R"(\s+|\S+)", R"(\p{L}+|\p{N}|.)", R"((?i:ab)|a*)", R"(x?)", R"(\b)", "(a|aa)*b",
  };
  std::vector<std::string> words;
  std::vector<std::pair<std::string, std::string>> merges;
  for (int i = 0, n = p.ConsumeIntegralInRange(0, 12); i < n; ++i) {
    // A merge of two earlier tokens (single bytes or earlier merges), as a trainer writes them.
    const auto pick = [&]() -> std::string {
      if (!words.empty() && p.ConsumeBool()) return words[p.ConsumeIntegralInRange<size_t>(0, words.size() - 1)];
      return std::string(1, static_cast<char>(p.ConsumeIntegral<uint8_t>()));
    };
    const std::string a = pick(), b = pick();
    words.push_back(a + b);
    merges.emplace_back(a, b);
  }
  const std::string pattern = p.ConsumeBool() ? p.PickValueInArray(kPatterns) : p.ConsumeRandomLengthString(24);
  json pre = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"}, {"pattern", {{"Regex", pattern}}}, {"behavior", "Isolated"}},
                {{"type", "Digits"}, {"individual_digits", p.ConsumeBool()}},
                data::test::byte_level(p.ConsumeBool())}}};
  json j = data::test::tokenizer_json(words, merges, pre, p.ConsumeBool());
  json added = json::array();
  for (int i = 0, n = p.ConsumeIntegralInRange(0, 3); i < n; ++i) {
    added.push_back(
        {{"id", 256 + words.size() + static_cast<size_t>(i)}, {"content", ascii_token(p)}, {"special", true}});
  }
  j["added_tokens"] = added;
  return j;
}

}  // namespace

void write_seeds(const std::string& dir) {
  json j = data::test::tokenizer_json({" t", " th", " the", "an", "and"},
                                      {{" ", "t"}, {" t", "h"}, {" th", "e"}, {"a", "n"}, {"an", "d"}},
                                      data::test::llama3_pre_tokenizer(), true);
  data::test::add_llama3_specials(j, 261);
  write_file_atomic(dir + "/llama3-like.json", dump_json(j));
  j = data::test::tokenizer_json({"ab"}, {{"a", "b"}}, data::test::byte_level(true));
  write_file_atomic(dir + "/gpt2-like.json", dump_json(j));
  write_file_atomic(dir + "/llama2-like.json", dump_json(data::test::sentencepiece_style(true, 'z')));
  j = data::test::sentencepiece_style(false);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "first"}, {"split", false}};
  j["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", "first"}};
  write_file_atomic(dir + "/metaspace-like.json", dump_json(j));
}

}  // namespace tessera::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  fuzz::check_file(fuzz::write_input("tokenizer.json", data, size));
  FuzzedDataProvider provider(data, size);
  const std::string recipe = dump_json(fuzz::recipe(provider), -1, true);
  const std::string text = provider.ConsumeRandomLengthString(200);
  const std::string path =
      fuzz::write_input("recipe.json", reinterpret_cast<const uint8_t*>(recipe.data()), recipe.size());
  std::optional<tessera::data::Tokenizer> tok;
  if (!fuzz::parses([&] { tok.emplace(path); })) return 0;
  fuzz::check_text(*tok, text, true);
  for (const char* t : fuzz::kTexts) fuzz::check_text(*tok, t, true);
  return 0;
}
