// Hugging Face tokenizer.json, byte-level BPE: pre-tokenizers, merges, added tokens, decoding.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "data/hf_tokenizer.h"

#include <fmt/format.h>
#include <pcre2.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <mutex>
#include <queue>
#include <unordered_map>
#include <variant>

#include "core/error.h"
#include "core/json.h"
#include "core/json_keys.h"
#include "data/text.h"

namespace tessera::data {
namespace {

using nlohmann::json;

// ---- UTF-8 ----

void append_utf8(std::string& out, uint32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

// GPT-2's table from bytes to characters: the printable bytes stand for themselves, the others
// for U+0100 onwards in order, so that every byte is a visible character (below U+0144).
std::array<uint32_t, 256> byte_level_code_points() {
  std::array<uint32_t, 256> cps{};
  uint32_t next = 256;
  for (uint32_t b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
    cps[b] = printable ? b : next++;
  }
  return cps;
}

// The table's characters, UTF-8 of each.
std::array<std::string, 256> byte_level_chars() {
  std::array<std::string, 256> chars;
  const std::array<uint32_t, 256> cps = byte_level_code_points();
  for (size_t b = 0; b < 256; ++b) append_utf8(chars[b], cps[b]);
  return chars;
}

// The table backwards: the byte each code point below 512 stands for, -1 where none.
using ByteOfCodePoint = std::array<int16_t, 512>;
ByteOfCodePoint byte_level_bytes() {
  ByteOfCodePoint bytes;
  bytes.fill(-1);
  const std::array<uint32_t, 256> cps = byte_level_code_points();
  for (size_t b = 0; b < 256; ++b) bytes[cps[b]] = static_cast<int16_t>(b);
  return bytes;
}

// A token's bytes: each character through the byte-level table, or the token's own UTF-8 where
// a character is not in the table (added tokens such as "<|eot_id|>" read the same either way).
std::string token_bytes(const std::string& token, const ByteOfCodePoint& byte_of) {
  std::string bytes;
  for (size_t i = 0; i < token.size();) {
    // The token is UTF-8 (JSON strings are); the table's characters are of one or two bytes.
    const auto lead = static_cast<unsigned char>(token[i]);
    uint32_t cp = lead;
    size_t len = 1;
    if ((lead & 0xE0) == 0xC0 && i + 1 < token.size()) {
      cp = ((lead & 0x1Fu) << 6) | (static_cast<unsigned char>(token[i + 1]) & 0x3Fu);
      len = 2;
    } else if (lead >= 0x80) {
      return token;
    }
    if (cp >= byte_of.size() || byte_of[cp] < 0) return token;
    bytes += static_cast<char>(byte_of[cp]);
    i += len;
  }
  return bytes;
}

// ---- normalizers (SentencePiece-style tokenizers: Llama 2's, Mistral's) ----

// Prepend `to` to a non-empty text, or replace every `from` with `to`.
struct NormalizerStep {
  bool prepend = false;
  std::string from, to;
};

std::string normalize(const std::vector<NormalizerStep>& steps, std::string text) {
  for (const NormalizerStep& step : steps) {
    if (step.prepend) {
      if (!text.empty()) text.insert(0, step.to);
      continue;
    }
    std::string out;
    for (size_t at = 0;;) {
      const size_t hit = text.find(step.from, at);
      out.append(text, at, hit == std::string::npos ? std::string::npos : hit - at);
      if (hit == std::string::npos) break;
      out += step.to;
      at = hit + step.from.size();
    }
    text = std::move(out);
  }
  return text;
}

// ---- pre-tokenizers ----

// GPT-2's pattern, which ByteLevel with use_regex splits on.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// A compiled pattern, UTF-8 with Unicode properties (\p{L}, \s as Unicode's white space), as
// Oniguruma reads the patterns of tokenizer.json.
class Regex {
 public:
  Regex(const std::string& pattern, std::string where) : where_(std::move(where)) {
    int err = 0;
    PCRE2_SIZE offset = 0;
    // No \C (one byte, inside a character): every match then ends between characters, so each
    // piece stays UTF-8, and the pieces are matched without PCRE2's check.
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NEVER_BACKSLASH_C, &err, &offset, nullptr);
    if (code_ == nullptr) {
      std::array<PCRE2_UCHAR, 256> msg{};
      pcre2_get_error_message(err, msg.data(), msg.size());
      throw DataError(fmt::format("{}: the regex cannot be compiled at offset {}: {}", where_, offset,
                                  reinterpret_cast<const char*>(msg.data())));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);  // where JIT is unavailable, matching interprets
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) of each non-empty match in `s`, in order.
  std::vector<std::pair<size_t, size_t>> matches(std::string_view s) const {
    std::vector<std::pair<size_t, size_t>> out;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(s.data());
    for (size_t at = 0; at <= s.size();) {
      // The text is valid UTF-8 (replace_invalid_utf8, and cut only between characters).
      const int rc = pcre2_match(code_, subject, s.size(), at, PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        throw DataError(fmt::format("{}: matching failed (PCRE2 error {})", where_, rc));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      if (ov[1] == ov[0]) {  // empty: move on one character
        at = ov[0] + 1;
        while (at < s.size() && (static_cast<unsigned char>(s[at]) & 0xC0) == 0x80) ++at;
        continue;
      }
      out.emplace_back(ov[0], ov[1]);
      at = ov[1];
    }
    pcre2_match_data_free(md);
    return out;
  }

 private:
  pcre2_code* code_ = nullptr;
  std::string where_;
};

// A pattern matching `text` literally.
std::string literal_pattern(const std::string& text) {
  std::string out;
  for (const char c : text) {
    if (static_cast<unsigned char>(c) < 0x80 && !std::isalnum(static_cast<unsigned char>(c))) out += '\\';
    out += c;
  }
  return out;
}

struct SplitStep {
  std::shared_ptr<const Regex> regex;
  bool remove = false;  // behavior Removed: the matches are dropped; Isolated: each is a piece
};
struct DigitsStep {
  bool individual = false;  // each digit a piece; else each run of digits
};
struct ByteLevelStep {
  bool add_prefix_space = false;
  std::shared_ptr<const Regex> regex;  // use_regex: GPT-2's split; else null
};
// Where a Metaspace step puts its replacement before a piece (that does not start with it).
enum class Prepend { kAlways, kFirst, kNever };  // kFirst: only before the text's first piece
struct MetaspaceStep {
  std::string replacement;  // spaces become it ("▁")
  Prepend prepend = Prepend::kAlways;
};
using PreTokenizer = std::variant<SplitStep, DigitsStep, ByteLevelStep, MetaspaceStep>;

// `piece` cut at the matches: each match a piece, and each stretch between them (Isolated), or
// only the stretches (Removed).
void split_isolated(const Regex& regex, bool remove, const std::string& piece, std::vector<std::string>& out) {
  size_t last = 0;
  for (const auto& [b, e] : regex.matches(piece)) {
    if (b > last) out.push_back(piece.substr(last, b - last));
    if (!remove) out.push_back(piece.substr(b, e - b));
    last = e;
  }
  if (last < piece.size()) out.push_back(piece.substr(last));
}

void split_digits(bool individual, const std::string& piece, std::vector<std::string>& out) {
  const auto digit = [](char c) { return c >= '0' && c <= '9'; };
  for (size_t i = 0; i < piece.size();) {
    size_t j = i + 1;
    if (digit(piece[i])) {
      while (!individual && j < piece.size() && digit(piece[j])) ++j;
    } else {
      while (j < piece.size() && !digit(piece[j])) ++j;
    }
    out.push_back(piece.substr(i, j - i));
    i = j;
  }
}

// The pieces after `step`; `at_text_start`: the first piece starts the text (not after an added
// token).
std::vector<std::string> apply(const PreTokenizer& step, std::vector<std::string> pieces, bool at_text_start) {
  std::vector<std::string> out;
  out.reserve(pieces.size());
  for (std::string& piece : pieces) {
    const bool first = at_text_start && out.empty();
    if (const auto* m = std::get_if<MetaspaceStep>(&step)) {  // split = false: one piece still
      piece = normalize({{false, " ", m->replacement}}, std::move(piece));
      if (!piece.starts_with(m->replacement) &&
          (m->prepend == Prepend::kAlways || (m->prepend == Prepend::kFirst && first))) {
        piece.insert(0, m->replacement);
      }
      out.push_back(std::move(piece));
    } else if (const auto* s = std::get_if<SplitStep>(&step)) {
      split_isolated(*s->regex, s->remove, piece, out);
    } else if (const auto* d = std::get_if<DigitsStep>(&step)) {
      split_digits(d->individual, piece, out);
    } else {
      const auto& bl = std::get<ByteLevelStep>(step);
      if (bl.add_prefix_space && !piece.starts_with(' ')) piece.insert(piece.begin(), ' ');
      if (bl.regex) {
        split_isolated(*bl.regex, false, piece, out);
      } else {
        out.push_back(std::move(piece));
      }
    }
  }
  return out;
}

// ---- decoders of SentencePiece-style tokenizers, each on the list of token strings ----

struct ReplaceDecoder {
  std::string from, to;
};
struct ByteFallbackDecoder {};  // runs of "<0xXX>" tokens to their bytes' text
struct FuseDecoder {};          // every token into one
struct StripDecoder {
  std::string content;  // one character
  size_t start = 0, stop = 0;
};
struct MetaspaceDecoder {
  std::string replacement;
  bool strip_first = true;  // the first token's leading space, unless prepend_scheme is never
};
using DecoderStep = std::variant<ReplaceDecoder, ByteFallbackDecoder, FuseDecoder, StripDecoder, MetaspaceDecoder>;

// The byte a "<0xXX>" token stands for, -1 for any other token.
int fallback_byte(const std::string& token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int b = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = token[i];
    const int d = c >= '0' && c <= '9'   ? c - '0'
                  : c >= 'A' && c <= 'F' ? c - 'A' + 10
                  : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : -1;
    if (d < 0) return -1;
    b = b * 16 + d;
  }
  return b;
}

// The length of the UTF-8 character that starts with `lead` (the text is UTF-8).
size_t char_length(char lead) {
  const auto c = static_cast<unsigned char>(lead);
  return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

std::vector<std::string> apply(const DecoderStep& step, std::vector<std::string> tokens) {
  if (const auto* r = std::get_if<ReplaceDecoder>(&step)) {
    for (std::string& t : tokens) t = normalize({{false, r->from, r->to}}, std::move(t));
    return tokens;
  }
  if (const auto* m = std::get_if<MetaspaceDecoder>(&step)) {
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = normalize({{false, m->replacement, " "}}, std::move(tokens[i]));
      if (i == 0 && m->strip_first && tokens[i].starts_with(' ')) tokens[i].erase(0, 1);
    }
    return tokens;
  }
  if (std::holds_alternative<FuseDecoder>(step)) {
    std::string all;
    for (const std::string& t : tokens) all += t;
    return {all};
  }
  if (const auto* st = std::get_if<StripDecoder>(&step)) {
    for (std::string& t : tokens) {
      for (size_t k = 0; k < st->start && t.starts_with(st->content); ++k) t.erase(0, st->content.size());
      for (size_t k = 0; k < st->stop && t.ends_with(st->content); ++k) t.resize(t.size() - st->content.size());
    }
    return tokens;
  }
  // ByteFallback: a run of byte tokens becomes its text where that is UTF-8, else one U+FFFD a byte.
  std::vector<std::string> out;
  std::string run;
  size_t run_tokens = 0;
  const auto flush = [&] {
    if (run_tokens == 0) return;
    if (find_invalid_utf8(run) < 0) {
      out.push_back(run);
    } else {
      for (size_t k = 0; k < run_tokens; ++k) out.emplace_back("\xEF\xBF\xBD");
    }
    run.clear();
    run_tokens = 0;
  };
  for (std::string& t : tokens) {
    if (const int b = fallback_byte(t); b >= 0) {
      run += static_cast<char>(b);
      ++run_tokens;
    } else {
      flush();
      out.push_back(std::move(t));
    }
  }
  flush();
  return out;
}

// A {"String": s} pattern's s (a regex pattern is not implemented here).
std::string string_pattern(const JsonKeys& step) {
  const json& pattern = step.at("pattern");
  if (!pattern.is_object() || !pattern.contains("String") || !pattern.at("String").is_string() ||
      pattern.at("String").get<std::string>().empty()) {
    step.fail("pattern", "is not {\"String\": \"...\"} (a Replace by regex is not implemented)");
  }
  return pattern.at("String").get<std::string>();
}

// A Metaspace step's replacement and where it goes: prepend_scheme, or the older add_prefix_space.
MetaspaceStep read_metaspace(const JsonKeys& step) {
  MetaspaceStep m{step.has("replacement") ? step.string("replacement") : "\u2581", Prepend::kAlways};
  if (m.replacement.empty()) step.fail("replacement", "is empty");
  if (step.has("prepend_scheme")) {
    const std::string scheme = step.string("prepend_scheme");
    if (scheme != "always" && scheme != "first" && scheme != "never") {
      step.fail("prepend_scheme", fmt::format("= \"{}\" is not always, first or never", scheme));
    }
    m.prepend = scheme == "always" ? Prepend::kAlways : scheme == "first" ? Prepend::kFirst : Prepend::kNever;
  } else if (!step.flag("add_prefix_space", true)) {
    m.prepend = Prepend::kNever;
  }
  return m;
}

DecoderStep read_decoder_step(const JsonKeys& step) {
  const std::string type = step.string("type");
  if (type == "Replace") return ReplaceDecoder{string_pattern(step), step.string("content")};
  if (type == "ByteFallback") return ByteFallbackDecoder{};
  if (type == "Metaspace") {
    const MetaspaceStep m = read_metaspace(step);
    return MetaspaceDecoder{m.replacement, m.prepend != Prepend::kNever};
  }
  if (type == "Fuse") return FuseDecoder{};
  if (type == "Strip") {
    const std::string content = step.string("content");
    if (content.empty() || char_length(content[0]) != content.size()) step.fail("content", "is not one character");
    return StripDecoder{content, static_cast<size_t>(step.integer("start", 0, 1 << 20)),
                        static_cast<size_t>(step.integer("stop", 0, 1 << 20))};
  }
  step.fail("type",
            fmt::format("\"{}\" is not implemented (Replace, ByteFallback, Fuse, Strip and Metaspace are)", type));
}

// ---- reading the file ----

PreTokenizer read_pre_tokenizer(const JsonKeys& step) {
  const std::string type = step.string("type");
  if (type == "Split") {
    if (step.flag("invert", false)) step.fail("invert", "= true is not implemented");
    const std::string behavior = step.string("behavior");
    if (behavior != "Isolated" && behavior != "Removed") {
      step.fail("behavior", fmt::format("\"{}\" is not implemented (Isolated and Removed are)", behavior));
    }
    const json& pattern = step.at("pattern");
    std::string regex;
    if (pattern.is_object() && pattern.contains("Regex") && pattern.at("Regex").is_string()) {
      regex = pattern.at("Regex").get<std::string>();
    } else if (pattern.is_object() && pattern.contains("String") && pattern.at("String").is_string()) {
      regex = literal_pattern(pattern.at("String").get<std::string>());
    } else {
      step.fail("pattern", "is neither {\"Regex\": ...} nor {\"String\": ...}");
    }
    return SplitStep{std::make_shared<const Regex>(regex, fmt::format("{}: {}pattern", step.origin(), step.where())),
                     behavior == "Removed"};
  }
  if (type == "Digits") return DigitsStep{step.flag("individual_digits", false)};
  if (type == "Metaspace") {
    // `tokenizers` splits at each replacement unless split is false (as Llama's converter writes).
    if (step.flag("split", true)) step.fail("split", "is true (the default): Metaspace's split is not implemented");
    return read_metaspace(step);
  }
  if (type == "ByteLevel") {
    ByteLevelStep out{step.flag("add_prefix_space", false), nullptr};
    if (step.flag("use_regex", true)) {
      out.regex = std::make_shared<const Regex>(kGpt2Pattern, fmt::format("{}: GPT-2's pattern", step.origin()));
    }
    return out;
  }
  step.fail("type",
            fmt::format("\"{}\" is not implemented (Sequence, Split, Digits, ByteLevel and Metaspace are)", type));
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool special;
};

// ---- the tokenizer ----

class HfBpe : public TokenizerModel {
 public:
  HfBpe(const std::string& bytes, const std::string& path) : path_(path), byte_chars_(byte_level_chars()) {
    json j;
    try {
      j = parse_json_or_throw(bytes);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("tokenizer {} is not valid JSON: {}", path, e.what()));
    }
    if (!j.is_object()) throw DataError(fmt::format("tokenizer {}: not a JSON object", path));
    // Ids run from 0 with few gaps; a bound keeps a corrupt file from sizing the table by its id.
    const json* model = j.contains("model") ? &j.at("model") : nullptr;
    const size_t entries = (model && model->is_object() && model->contains("vocab") ? model->at("vocab").size() : 0) +
                           (j.contains("added_tokens") ? j.at("added_tokens").size() : 0);
    id_limit_ = static_cast<int64_t>(2 * entries + 1024);
    const JsonKeys top(j, "tokenizer " + path);
    read_normalizer(top);
    read_pre_tokenizers(top);
    read_model(top.object("model"));
    read_added_tokens(top);
    read_decoder(top);
    read_post_processor(top);
    pick_special_tokens();
  }

  std::vector<int32_t> encode(std::string_view raw) const override {
    const std::string text = replace_invalid_utf8(raw);
    std::vector<int32_t> ids;
    size_t last = 0;
    const auto plain = [&](size_t end) {
      if (end > last) encode_plain(text.substr(last, end - last), last == 0, ids);
    };
    for (size_t i = 0; i < text.size();) {
      if (const AddedToken* t = added_at(text, i)) {
        plain(i);
        ids.push_back(t->id);
        i += t->content.size();
        last = i;
      } else {
        ++i;
      }
    }
    plain(text.size());
    return ids;
  }

  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string bytes;
    for (const int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || id_to_token_[static_cast<size_t>(id)].empty()) {
        throw DataError(fmt::format("tokenizer {}: cannot decode token id {}: not in the vocabulary", path_, id));
      }
      if (byte_level_) bytes += id_to_bytes_[static_cast<size_t>(id)];
    }
    if (!byte_level_) {
      std::vector<std::string> tokens;
      for (const int32_t id : ids) tokens.push_back(id_to_token_[static_cast<size_t>(id)]);
      for (const DecoderStep& step : decoders_) tokens = apply(step, std::move(tokens));
      for (const std::string& t : tokens) bytes += t;
    }
    return replace_invalid_utf8(bytes);
  }

  int64_t vocab_size() const override { return static_cast<int64_t>(id_to_token_.size()); }
  int32_t bos_id() const override { return bos_; }
  int32_t eos_id() const override { return eos_; }
  std::vector<int32_t> stop_tokens() const override { return stop_; }
  std::vector<int32_t> document_start() const override {
    if (template_bos_ < 0) return {};
    return {template_bos_};
  }

 private:
  // None, or Prepend and Replace steps (a SentencePiece-style tokenizer's, as Llama 2's).
  void read_normalizer(const JsonKeys& top) {
    if (!top.has("normalizer")) return;
    const JsonKeys n = top.object("normalizer");
    if (n.string("type") != "Sequence") return read_normalizer_step(n);
    for (size_t i = 0; i < n.array("normalizers").size(); ++i) read_normalizer_step(n.element("normalizers", i));
  }

  void read_normalizer_step(const JsonKeys& step) {
    const std::string type = step.string("type");
    if (type == "Prepend") {
      normalizers_.push_back({true, "", step.string("prepend")});
    } else if (type == "Replace") {
      normalizers_.push_back({false, string_pattern(step), step.string("content")});
    } else {
      step.fail("type", fmt::format("\"{}\" is not implemented (Prepend and Replace of a string are)", type));
    }
  }

  void read_pre_tokenizers(const JsonKeys& top) {
    if (!top.has("pre_tokenizer")) return;  // the text is one word (SentencePiece-style)
    const JsonKeys p = top.object("pre_tokenizer");
    if (p.string("type") == "Sequence") {
      for (size_t i = 0; i < p.array("pretokenizers").size(); ++i) {
        pre_.push_back(read_pre_tokenizer(p.element("pretokenizers", i)));
      }
    } else {
      pre_.push_back(read_pre_tokenizer(p));
    }
    byte_level_ = std::any_of(pre_.begin(), pre_.end(),
                              [](const PreTokenizer& s) { return std::holds_alternative<ByteLevelStep>(s); });
  }

  void read_model(const JsonKeys& m) {
    if (m.contains("type") && m.string("type") != "BPE") {
      m.fail("type", fmt::format("\"{}\" is not implemented (BPE is)", m.string("type")));
    }
    if (const bool byte_fallback = m.flag("byte_fallback", false); byte_level_ == byte_fallback) {
      m.fail("byte_fallback", byte_level_ ? "= true beside a ByteLevel pre-tokenizer is not implemented"
                                          : "is not true, and the pre_tokenizer has no ByteLevel step: the tokenizer "
                                            "is neither byte-level BPE (GPT-2's, Llama 3's) nor SentencePiece-style "
                                            "BPE with byte fallback (Llama 2's), the two implemented");
    }
    if (m.has("dropout") && m.at("dropout") != 0) {
      m.fail("dropout", "is set: BPE dropout is for training a tokenizer, not for encoding with one");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (m.has(key) && m.at(key) != "") m.fail(key, "is not implemented");
    }
    ignore_merges_ = m.flag("ignore_merges", false);
    const JsonKeys vocab = m.object("vocab");
    for (const auto& [token, id] : vocab.value().items()) {
      if (token.empty()) m.fail("vocab", "has an empty token");
      set_token(token_id(m, fmt::format("vocab[\"{}\"]", token), id), token, m, "vocab");
      vocab_[token] = id.get<int32_t>();
    }
    for (int b = 0; b < 256; ++b) {
      // Byte-level: the byte's character, which every byte needs. Byte fallback: "<0xXX>", which
      // a character outside the vocabulary needs for each of its bytes, else it is the unk token.
      const auto it = vocab_.find(byte_level_ ? byte_chars_[static_cast<size_t>(b)] : fmt::format("<0x{:02X}>", b));
      if (byte_level_ && it == vocab_.end()) m.fail("vocab", fmt::format("has no token for byte 0x{:02x}", b));
      byte_ids_[static_cast<size_t>(b)] = it == vocab_.end() ? -1 : it->second;
    }
    if (m.has("unk_token")) {
      const auto it = vocab_.find(m.string("unk_token"));
      if (it == vocab_.end())
        m.fail("unk_token", fmt::format("\"{}\" is not in the vocabulary", m.string("unk_token")));
      unk_ = it->second;
    }
    fuse_unk_ = m.flag("fuse_unk", false);
    read_merges(m);
  }

  void read_merges(const JsonKeys& m) {
    const json& merges = m.array("merges");
    merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& e = merges[rank];
      const std::string key = fmt::format("merges[{}]", rank);
      std::string a, b;
      if (e.is_string()) {  // "a b"
        const std::string s = e.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          m.fail(key, fmt::format("\"{}\" is not two tokens", s));
        }
        a = s.substr(0, space);
        b = s.substr(space + 1);
      } else if (e.is_array() && e.size() == 2 && e[0].is_string() && e[1].is_string()) {  // ["a", "b"]
        a = e[0].get<std::string>();
        b = e[1].get<std::string>();
      } else {
        m.fail(key, "is neither \"a b\" nor [\"a\", \"b\"]");
      }
      const auto ia = vocab_.find(a), ib = vocab_.find(b), ab = vocab_.find(a + b);
      if (ia == vocab_.end() || ib == vocab_.end() || ab == vocab_.end()) {
        m.fail(key, fmt::format("merges \"{}\" and \"{}\", not both in the vocabulary with their merge", a, b));
      }
      merges_.emplace(pair_key(ia->second, ib->second), Merge{static_cast<int32_t>(rank), ab->second});
    }
  }

  void read_added_tokens(const JsonKeys& top) {
    if (!top.has("added_tokens")) return;
    for (size_t i = 0; i < top.array("added_tokens").size(); ++i) {
      const JsonKeys entry = top.element("added_tokens", i);
      AddedToken t{entry.string("content"), token_id(entry, "id", entry.at("id")), entry.flag("special", false)};
      if (t.content.empty()) entry.fail("content", "is empty");
      for (const char* key : {"lstrip", "rstrip", "single_word"}) {
        if (entry.flag(key, false)) entry.fail(key, "= true is not implemented");
      }
      set_token(t.id, t.content, top, "added_tokens");
      added_.push_back(std::move(t));
    }
    // Longest first, so the leftmost match is also the longest, as `tokenizers` matches them.
    std::stable_sort(added_.begin(), added_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (const AddedToken& t : added_) added_first_bytes_[static_cast<unsigned char>(t.content[0])] = true;
  }

  void read_decoder(const JsonKeys& top) {
    if (!byte_level_) {  // SentencePiece-style: a chain over the token strings
      const JsonKeys d = top.object("decoder");
      if (d.string("type") != "Sequence") {
        decoders_.push_back(read_decoder_step(d));
      } else {
        for (size_t i = 0; i < d.array("decoders").size(); ++i)
          decoders_.push_back(read_decoder_step(d.element("decoders", i)));
      }
      return;
    }
    if (!top.has("decoder") || top.object("decoder").string("type") != "ByteLevel") {
      top.fail("decoder", "is not ByteLevel, as a byte-level BPE tokenizer's must be");
    }
    const ByteOfCodePoint byte_of = byte_level_bytes();
    id_to_bytes_.reserve(id_to_token_.size());
    for (const std::string& token : id_to_token_) id_to_bytes_.push_back(token_bytes(token, byte_of));
  }

  // The BOS of a TemplateProcessing post-processor (alone or in a Sequence): its single
  // template's first item, when that is a special token.
  void read_post_processor(const JsonKeys& top) {
    if (!top.has("post_processor")) return;
    const JsonKeys p = top.object("post_processor");
    const auto type_of = [](const json& q) {  // "" unless an object with a string type
      return q.is_object() && q.contains("type") && q.at("type").is_string() ? q.at("type").get<std::string>() : "";
    };
    std::vector<JsonKeys> candidates{p};
    if (type_of(p.value()) == "Sequence" && p.contains("processors") && p.at("processors").is_array()) {
      for (size_t i = 0; i < p.at("processors").size(); ++i) {
        if (p.at("processors")[i].is_object()) candidates.push_back(p.element("processors", i));
      }
    }
    for (const JsonKeys& q : candidates) {
      if (type_of(q.value()) != "TemplateProcessing") continue;
      const json& single = q.at("single");
      if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) return;
      const std::string name = q.element("single", 0).object("SpecialToken").string("id");
      const JsonKeys entry = q.object("special_tokens").object(name);
      const json& ids = entry.at("ids");
      if (!ids.is_array() || ids.size() != 1 || !ids[0].is_number_integer() || ids[0].get<int64_t>() < 0 ||
          ids[0].get<int64_t>() >= vocab_size() || id_to_token_[ids[0].get<size_t>()].empty()) {
        entry.fail("ids", "is not one token id of the vocabulary");
      }
      template_bos_ = ids[0].get<int32_t>();
      return;
    }
  }

  // The first added token of `names` (in their order); -1 when there is none.
  int32_t added_id(std::initializer_list<const char*> names) const {
    for (const char* name : names) {
      for (const AddedToken& t : added_) {
        if (t.content == name) return t.id;
      }
    }
    return -1;
  }

  void pick_special_tokens() {
    eos_ = added_id({"<|end_of_text|>", "<|endoftext|>", "</s>"});
    bos_ = template_bos_ >= 0 ? template_bos_ : added_id({"<|begin_of_text|>", "<s>", "<|startoftext|>"});
    if (eos_ >= 0) stop_.push_back(eos_);
    // The ends of a chat model's turn: Llama 3's (a message, a tool call), ChatML's (SmolLM, Qwen).
    for (const char* name : {"<|eot_id|>", "<|eom_id|>", "<|im_end|>"}) {
      if (const int32_t id = added_id({name}); id >= 0 && id != eos_) stop_.push_back(id);
    }
  }

  // `id`, the value at `key` of `keys`, checked to be a token id.
  int32_t token_id(const JsonKeys& keys, const std::string& key, const json& id) const {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= id_limit_) {
      keys.fail(key,
                fmt::format("is not a token id in [0, {}) (twice the tokens the file lists, and 1024)", id_limit_));
    }
    return id.get<int32_t>();
  }

  void set_token(int32_t id, const std::string& token, const JsonKeys& keys, const char* key) {
    if (static_cast<size_t>(id) >= id_to_token_.size()) id_to_token_.resize(static_cast<size_t>(id) + 1);
    std::string& slot = id_to_token_[static_cast<size_t>(id)];
    if (!slot.empty() && slot != token) {
      keys.fail(key, fmt::format("gives id {} to both \"{}\" and \"{}\"", id, slot, token));
    }
    slot = token;
  }

  // The added token that starts at text[i], the longest where several do.
  const AddedToken* added_at(const std::string& text, size_t i) const {
    if (!added_first_bytes_[static_cast<unsigned char>(text[i])]) return nullptr;
    for (const AddedToken& t : added_) {
      if (text.compare(i, t.content.size(), t.content) == 0) return &t;
    }
    return nullptr;
  }

  void encode_plain(const std::string& text, bool at_text_start, std::vector<int32_t>& ids) const {
    std::vector<std::string> pieces{normalize(normalizers_, text)};
    for (const PreTokenizer& step : pre_) pieces = apply(step, std::move(pieces), at_text_start);
    for (const std::string& piece : pieces) encode_word(piece, ids);
  }

  // One pre-token through BPE: its bytes as byte-level tokens, then the lowest-ranked merge of two
  // neighbours, leftmost first, until none applies (as `tokenizers` merges).
  void encode_word(const std::string& word, std::vector<int32_t>& ids) const {
    if (word.empty()) return;
    {
      std::lock_guard lock(cache_mutex_);
      if (const auto it = cache_.find(word); it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int32_t> out = merge_word(word);
    ids.insert(ids.end(), out.begin(), out.end());
    if (word.size() > kCacheWordBytes) return;  // a SentencePiece-style text is one word: rarely again
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() >= kCacheWords) cache_.clear();
    cache_.emplace(word, std::move(out));
  }

  // The tokens a word starts from: byte-level, one per byte; SentencePiece-style, one per
  // character, or its bytes' "<0xXX>" where the vocabulary lacks it, else the unk token (one for a
  // run of them with fuse_unk).
  std::vector<int32_t> initial_tokens(const std::string& word) const {
    std::vector<int32_t> ids;
    if (byte_level_) {
      for (const char c : word) ids.push_back(byte_ids_[static_cast<unsigned char>(c)]);
      return ids;
    }
    bool after_unk = false;
    for (size_t i = 0; i < word.size();) {
      const size_t len = std::min(char_length(word[i]), word.size() - i);
      const auto it = vocab_.find(word.substr(i, len));
      const bool bytes = it == vocab_.end() && std::all_of(word.begin() + static_cast<ptrdiff_t>(i),
                                                           word.begin() + static_cast<ptrdiff_t>(i + len), [&](char c) {
                                                             return byte_ids_[static_cast<unsigned char>(c)] >= 0;
                                                           });
      if (it != vocab_.end()) {
        ids.push_back(it->second);
      } else if (bytes) {
        for (size_t k = i; k < i + len; ++k) ids.push_back(byte_ids_[static_cast<unsigned char>(word[k])]);
      } else if (unk_ < 0) {
        throw DataError(fmt::format("tokenizer {}: cannot encode \"{}\": not in the vocabulary, and no unk_token",
                                    path_, word.substr(i, len)));
      } else if (!(fuse_unk_ && after_unk)) {
        ids.push_back(unk_);
      }
      after_unk = it == vocab_.end() && !bytes;
      i += len;
    }
    return ids;
  }

  std::vector<int32_t> merge_word(const std::string& word) const {
    if (ignore_merges_) {
      std::string mapped;
      if (byte_level_) {
        for (const char c : word) mapped += byte_chars_[static_cast<unsigned char>(c)];
      }
      if (const auto it = vocab_.find(byte_level_ ? mapped : word); it != vocab_.end()) return {it->second};
    }
    struct Symbol {
      int32_t id;
      int prev, next;
      bool alive;
    };
    const std::vector<int32_t> start = initial_tokens(word);
    const int n = static_cast<int>(start.size());
    if (n == 0) return {};
    std::vector<Symbol> sym(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i)
      sym[static_cast<size_t>(i)] = {start[static_cast<size_t>(i)], i - 1, i + 1 < n ? i + 1 : -1, true};
    struct Candidate {
      int32_t rank;
      int left, right;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> queue;
    const auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      const auto it = merges_.find(pair_key(sym[static_cast<size_t>(left)].id, sym[static_cast<size_t>(right)].id));
      if (it != merges_.end()) queue.push({it->second.rank, left, right});
    };
    for (int i = 0; i + 1 < n; ++i) consider(i, i + 1);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol& l = sym[static_cast<size_t>(c.left)];
      if (!l.alive || l.next != c.right) continue;  // a neighbour has merged since
      Symbol& r = sym[static_cast<size_t>(c.right)];
      const auto it = merges_.find(pair_key(l.id, r.id));
      if (it == merges_.end() || it->second.rank != c.rank) continue;
      l.id = it->second.id;
      r.alive = false;
      l.next = r.next;
      if (r.next >= 0) sym[static_cast<size_t>(r.next)].prev = c.left;
      consider(l.prev, c.left);
      consider(c.left, l.next);
    }
    std::vector<int32_t> out;
    for (int i = 0; i >= 0; i = sym[static_cast<size_t>(i)].next) out.push_back(sym[static_cast<size_t>(i)].id);
    return out;
  }

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  struct Merge {
    int32_t rank;
    int32_t id;  // of the merged token
  };
  static constexpr size_t kCacheWords = 1 << 16, kCacheWordBytes = 256;

  std::string path_;
  std::array<std::string, 256> byte_chars_;
  std::array<int32_t, 256> byte_ids_{};  // each byte's token; -1 where a fallback one is missing
  std::vector<NormalizerStep> normalizers_;
  std::vector<PreTokenizer> pre_;
  bool byte_level_ = false;  // a ByteLevel pre-tokenizer: GPT-2's scheme; else SentencePiece-style
  int32_t unk_ = -1;
  bool fuse_unk_ = false;
  std::vector<DecoderStep> decoders_;  // SentencePiece-style
  std::unordered_map<std::string, int32_t> vocab_;
  std::unordered_map<uint64_t, Merge> merges_;
  bool ignore_merges_ = false;
  std::vector<AddedToken> added_;
  std::array<bool, 256> added_first_bytes_{};
  std::vector<std::string> id_to_token_;  // "" for an id nothing names
  std::vector<std::string> id_to_bytes_;  // what each id decodes to; "" for an id nothing names
  int32_t template_bos_ = -1, bos_ = -1, eos_ = -1;
  std::vector<int32_t> stop_;  // the EOS, then the ends of turn the file has
  int64_t id_limit_ = 0;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache_;
};

}  // namespace

bool is_hf_tokenizer(std::string_view bytes) {
  const size_t first = bytes.find_first_not_of(" \t\r\n");
  return first != std::string_view::npos && bytes[first] == '{';
}

std::unique_ptr<TokenizerModel> load_hf_tokenizer(const std::string& bytes, const std::string& path) {
  return std::make_unique<HfBpe>(bytes, path);
}

}  // namespace tessera::data
