// Raw text inputs: whole files, plain or zstd-compressed (".zst"), checked to be UTF-8 (or
// repaired), and cut into documents at blank lines.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

// The file's text, decompressed when the name ends in ".zst". Throws DataError naming the file
// when it is missing, unreadable, empty, not valid zstd, or not valid UTF-8 (with the byte
// offset of the first bad sequence).
std::string read_text_file(const std::string& path);

// Byte offset of the first invalid UTF-8 sequence, or -1 when `text` is valid.
int64_t find_invalid_utf8(std::string_view text);

// `text` with each invalid UTF-8 sequence replaced by U+FFFD, one for each maximal subpart (as
// Unicode and WHATWG advise, and Rust's String::from_utf8_lossy does): "\xE2\x82" is one U+FFFD,
// "\xC0\x80" two. Valid text comes back unchanged.
std::string replace_invalid_utf8(std::string_view text);

// Documents of `text`: runs of lines separated by one or more blank lines (lines holding only
// whitespace count as blank). Views into `text`, without the separating blank lines.
std::vector<std::string_view> split_documents(std::string_view text);

// Offsets that cut `text` into at most `parts` pieces of about equal size, each cut at a
// document boundary: [0, c1, c2, ..., text.size()].
std::vector<size_t> split_at_documents(std::string_view text, int parts);

}  // namespace tessera::data
