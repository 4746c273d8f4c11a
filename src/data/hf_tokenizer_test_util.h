// Test helpers: tokenizer.json files of byte-level and SentencePiece-style BPE built in code
// (hf_tokenizer_test.cc, prepare_test.cc, fuzz/tokenizer_json_fuzz.cc).
#pragma once

#include <fmt/format.h>

#include <string>
#include <utility>
#include <vector>

#include "core/json.h"

namespace tessera::data::test {

using nlohmann::json;

inline constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// GPT-2's bytes_to_unicode, written out again here: the printable bytes stand for themselves,
// the rest for U+0100, U+0101, ... in byte order.
inline std::string byte_char(unsigned char b) {
  uint32_t c = b;
  if (!((b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE)) {
    c = 256;
    for (unsigned x = 0; x < b; ++x) {
      if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) ++c;
    }
  }
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

inline std::string mapped(const std::string& text) {
  std::string s;
  for (const char c : text) s += byte_char(static_cast<unsigned char>(c));
  return s;
}

// A tokenizer.json: the 256 byte tokens (ids 0..255), then `words` (their byte-level spelling,
// ids 256 on), the merges "a b" of byte-level spellings, the pre-tokenizer given.
inline json tokenizer_json(const std::vector<std::string>& words,
                           const std::vector<std::pair<std::string, std::string>>& merges, json pre_tokenizer,
                           bool ignore_merges = false) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_char(static_cast<unsigned char>(b))] = b;
  for (const std::string& w : words) {
    if (!vocab.contains(mapped(w))) vocab[mapped(w)] = vocab.size();
  }
  json m = json::array();
  for (const auto& [a, b] : merges) m.push_back(mapped(a) + " " + mapped(b));
  return {{"version", "1.0"},
          {"added_tokens", json::array()},
          {"normalizer", nullptr},
          {"pre_tokenizer", std::move(pre_tokenizer)},
          {"post_processor", nullptr},
          {"decoder", {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}}},
          {"model",
           {{"type", "BPE"}, {"dropout", nullptr}, {"ignore_merges", ignore_merges}, {"vocab", vocab}, {"merges", m}}}};
}

inline json byte_level(bool use_regex = true) {
  return {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", use_regex}};
}

inline json llama3_pre_tokenizer() {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", kLlama3Pattern}}}, {"behavior", "Isolated"}, {"invert", false}},
            byte_level(false)}}};
}

// Llama 3's special tokens and template around tokenizer_json's vocabulary: <|begin_of_text|>
// (BOS, put first by the template) and <|end_of_text|> (EOS), ids `first` and `first` + 1.
inline void add_llama3_specials(json& j, int first) {
  j["added_tokens"] = {{{"id", first}, {"content", "<|begin_of_text|>"}, {"special", true}},
                       {{"id", first + 1}, {"content", "<|end_of_text|>"}, {"special", true}}};
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {byte_level(),
        {{"type", "TemplateProcessing"},
         {"single", {{{"SpecialToken", {{"id", "<|begin_of_text|>"}, {"type_id", 0}}}}, {{"Sequence", {{"id", "A"}}}}}},
         {"special_tokens", {{"<|begin_of_text|>", {{"id", "<|begin_of_text|>"}, {"ids", {first}}}}}}}}}};
}

// A SentencePiece-style tokenizer.json, as Llama 2's: ids 0-2 <unk>, <s>, </s>; 3-258 the
// byte-fallback tokens <0x00>..<0xFF> (one dropped with drop_byte >= 0); then "▁", "a", "b",
// "é", "▁a", "ab"; merges "▁ a" before "a b". The normalizer prepends "▁" and spells spaces "▁";
// the decoder undoes that and strips the text's leading space.
inline json sentencepiece_style(bool fuse_unk, int drop_byte = -1) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    if (b != drop_byte) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  }
  int next = 259;
  for (const char* w : {"\u2581", "a", "b", "\u00e9", "\u2581a", "ab"}) vocab[w] = next++;
  const json replace_space = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  return {{"added_tokens",
           {{{"id", 0}, {"content", "<unk>"}, {"special", true}},
            {{"id", 1}, {"content", "<s>"}, {"special", true}},
            {{"id", 2}, {"content", "</s>"}, {"special", true}}}},
          {"normalizer",
           {{"type", "Sequence"}, {"normalizers", {{{"type", "Prepend"}, {"prepend", "\u2581"}}, replace_space}}}},
          {"pre_tokenizer", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"unk_token", "<unk>"},
            {"fuse_unk", fuse_unk},
            {"byte_fallback", true},
            {"vocab", vocab},
            {"merges", {"\u2581 a", "a b"}}}}};
}

}  // namespace tessera::data::test
