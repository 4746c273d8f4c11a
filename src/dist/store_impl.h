// Helpers shared by the Store implementations (file_store.cc, etcd_store.cc, store.cc).
#pragma once

#include <cctype>
#include <string>
#include <vector>

namespace tessera::dist::detail {

// Token, round and prefix parts become path components: refuse anything that could climb or nest.
inline bool valid_store_name(const std::string& name) {
  bool ok = !name.empty() && name != "." && name != "..";
  for (char c : name) {
    ok = ok && (std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.');
  }
  return ok;
}

// 'a', 'b' for error messages.
inline std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "'" : ", '") + k + "'";
  return s;
}

}  // namespace tessera::dist::detail
