// Small text helpers shared by the parsers of files and logs.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <string_view>

namespace tessera {

// `s` without leading and trailing blanks (spaces, tabs, carriage returns).
inline std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t\r");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// A checksum or hash as files hold it: 16 lowercase hex digits ("%016x").
inline std::string hex64(uint64_t value) { return fmt::format("{:016x}", value); }

// hex64 backwards; false on anything but 1 to 16 lowercase hex digits.
inline bool parse_hex64(std::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 16) return false;
  uint64_t v = 0;
  for (const char c : text) {
    const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
    if (d < 0) return false;
    v = v << 4 | static_cast<uint64_t>(d);
  }
  *out = v;
  return true;
}

}  // namespace tessera
