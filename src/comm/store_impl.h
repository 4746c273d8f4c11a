// Helpers shared by the Store implementations (file_store.cc, etcd_store.cc, tcp_store.cc, store.cc).
#pragma once

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdint>
#include <string>
#include <vector>

namespace tessera::comm::detail {

// Token, round and prefix parts become path components: refuse anything that could climb or nest.
inline bool valid_store_name(const std::string& name) {
  bool ok = !name.empty() && name != "." && name != "..";
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  }
  return ok;
}

// An etcd prefix: leading and trailing '/' dropped, the rest NAME[/NAME...] of valid names; ""
// when it is not one.
inline std::string clean_store_prefix(const std::string& prefix) {
  size_t first = prefix.find_first_not_of('/');
  if (first == std::string::npos) return "";
  std::string clean = prefix.substr(first, prefix.find_last_not_of('/') - first + 1);
  for (size_t begin = 0; begin <= clean.size();) {
    size_t end = std::min(clean.find('/', begin), clean.size());
    if (!valid_store_name(clean.substr(begin, end - begin))) return "";
    begin = end + 1;
  }
  return clean;
}

// A counter's stored value (add() keeps decimal text): false unless `text` is exactly an integer.
inline bool parse_counter(const std::string& text, int64_t* value) {
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), *value);
  return !text.empty() && ec == std::errc() && end == text.data() + text.size();
}

// 'a', 'b' for error messages.
inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

}  // namespace tessera::comm::detail
