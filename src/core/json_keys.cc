// Typed reads of JSON keys, each failure naming the file and the key.
#include "core/json_keys.h"

#include <fmt/format.h>

#include <charconv>

#include "core/error.h"

namespace tessera {

using nlohmann::json;

const json& JsonKeys::at(const json& obj, const std::string& key, const std::string& where) const {
  if (!obj.is_object() || !obj.contains(key)) fail(where + key, "is missing");
  return obj.at(key);
}

std::string JsonKeys::string(const json& obj, const std::string& key, const std::string& where) const {
  const json& v = at(obj, key, where);
  if (!v.is_string()) fail(where + key, "is not a string");
  return v.get<std::string>();
}

int64_t JsonKeys::integer(const json& obj, const std::string& key, const std::string& where) const {
  const json& v = at(obj, key, where);
  if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > INT64_MAX)) {
    fail(where + key, "is not an integer of 64 bits");
  }
  return v.get<int64_t>();
}

uint64_t JsonKeys::unsigned_integer(const json& obj, const std::string& key, const std::string& where) const {
  const json& v = at(obj, key, where);
  if (!v.is_number_unsigned()) fail(where + key, "is not a non-negative integer");
  return v.get<uint64_t>();
}

uint64_t JsonKeys::hex64(const json& obj, const std::string& key, const std::string& where) const {
  const std::string s = string(obj, key, where);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v, 16);
  if (s.size() != 16 || ec != std::errc() || end != s.data() + s.size()) {
    fail(where + key, fmt::format("= \"{}\" is not 16 hex digits", s));
  }
  return v;
}

bool JsonKeys::flag(const json& obj, const std::string& key, const std::string& where, bool fallback) const {
  if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
  if (!obj.at(key).is_boolean()) fail(where + key, "is not true or false");
  return obj.at(key).get<bool>();
}

void JsonKeys::fail(const std::string& path, const std::string& what) const {
  throw DataError(fmt::format("{}: {} {}", origin_, path, what));
}

}  // namespace tessera
